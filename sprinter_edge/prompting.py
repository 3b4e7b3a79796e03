"""Prompts: the model's own chat template, and turning text into prompt tokens."""

from __future__ import annotations

import re
from collections.abc import Sequence

from .backend.llama import LlamaModel
from .errors import SettingsError, SprinterError

Message = dict  # {"role": "system" | "user" | "assistant", "content": str}

# What makes a request a code request: code in it (fences, inline code, keywords) or words that
# ask for code. 96% agreement with the categories of the verifier corpus (code_write/fix/explain
# vs chat/cs_concept); a verifier's per-domain presets are chosen with it.
_CODE_CUES = re.compile(
    r"```|`[^`\n]+`|\bdef |\bclass\b|\bfunction\b|\bimport |#include|\breturn\b|\b(code|snippet|script|"
    r"program|implement|implementation|compiler?|bug|regex|regular expression|query|python|"
    r"javascript|typescript|java|rust|golang|kotlin|swift|haskell|ruby|php|c\+\+|c#|bash|shell|sql|"
    r"html|css|json|yaml|api|refactor|unit tests?|one-liner|debug|stack trace|exception|variable|"
    r"loop|array|dict|component|react|pandas|numpy|git|awk|sed|grep)\b|\bin (go|c)\b", re.I)


def prompt_domain(prompt: str | Sequence[Message]) -> str:
    """'code' when the request is about code, else 'chat' (the user's messages are read).
    Not `request_kind`: the domain picks the verifier's presets, calibrated per domain on its
    corpus (an edit request is in the code domain); the kind is what auto learns per."""
    return "code" if _CODE_CUES.search(_user_text(prompt)) else "chat"

# A request that carries code or a document the reply may copy: a fenced block of a few lines,
# or a long paste. Copy-based proposals pay there; auto keeps its evidence per kind.
_FENCED = re.compile(r"```[^\n]*\n(?:[^\n]*\n){3,}?[^\n]*```", re.S)
_PASTE_CHARS = 1200


def request_kind(prompt: str | Sequence[Message]) -> str:
    """'edit' (the request carries code or a document to work on), else prompt_domain's."""
    text = _user_text(prompt)
    if _FENCED.search(text) or len(text) >= _PASTE_CHARS:
        return "edit"
    return prompt_domain(prompt)


def _user_text(prompt: str | Sequence[Message]) -> str:
    if isinstance(prompt, str):
        return prompt
    return "\n".join(str(m.get("content", "")) for m in prompt
                     if isinstance(m, dict) and m.get("role") == "user")


_FALLBACK = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}assistant:"


def render_chat(model: LlamaModel, messages: Sequence[Message], *, add_generation_prompt: bool = True,
                tools: Sequence[dict] | None = None) -> str:
    """Render messages with the chat template stored in the GGUF (jinja2, sandboxed); `tools`
    (OpenAI tool definitions) go to the template's `tools` variable (serving/tools.py decides
    which templates get them)."""
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter

    for m in messages:
        if not isinstance(m, dict) or "role" not in m or "content" not in m:
            raise SettingsError("each chat message needs a 'role' and a 'content'")
    template = model.chat_template or _FALLBACK
    formatter = Jinja2ChatFormatter(
        template=template,
        eos_token=model.token_text(model.eos_id) if model.eos_id >= 0 else "",
        bos_token=model.token_text(model.bos_id) if model.bos_id >= 0 else "",
        add_generation_prompt=add_generation_prompt,
    )
    try:
        return formatter(messages=list(messages), tools=list(tools) if tools else None).prompt
    except Exception as exc:  # a template error is the user's input problem, not a crash
        raise SprinterError(f"the model's chat template failed on these messages: {exc}") from exc


def prompt_tokens(model: LlamaModel, text: str, *, chat_rendered: bool) -> list[int]:
    """Tokenize a prompt; a rendered chat template already carries its special tokens."""
    bos = model.token_text(model.bos_id) if model.bos_id >= 0 else ""
    add_special = not (chat_rendered and bos and text.startswith(bos))
    tokens = model.tokenize(text, add_special=add_special, special=chat_rendered)
    if not tokens:
        if model.bos_id >= 0:
            return [model.bos_id]
        raise SettingsError("the prompt is empty")
    return tokens
