"""Request bodies of the OpenAI-compatible endpoints (pydantic; unknown fields are refused).

The standard OpenAI fields that sprinter-edge cannot honour are accepted only at their
neutral values, so a client that sends them explicitly still works; `method`, `threshold`,
`top_k`, `repeat_penalty`, `repeat_last_n`, `return_progress`, `json_schema` and `grammar` are
extensions (all but the first two named as in llama.cpp's server); `model` may be any name.
The structured-output fields are kept as sent here and compiled by jobs.request_params, where
a bad one is a 400 naming its field. docs/server.md lists every field."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from ..decoding.sampling import MAX_LOGPROBS
from ..methods import methods


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class FunctionCall(_Strict):
    name: str
    arguments: str  # JSON text


class ToolCallIn(_Strict):
    """A call the assistant made earlier in the conversation."""

    id: str | None = None
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(_Strict):
    role: Literal["system", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCallIn] | None = None  # assistant
    tool_call_id: str | None = None  # tool

    @model_validator(mode="after")
    def _check(self) -> ChatMessage:
        if self.tool_calls is not None and self.role != "assistant":
            raise ValueError("only assistant messages carry tool_calls")
        if self.content is None and not (self.role == "assistant" and self.tool_calls):
            raise ValueError(f"a {self.role} message needs a content")
        return self

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)

    def to_dict(self) -> dict[str, Any]:
        """The message as the prompt side takes it: role, text content and the tool fields."""
        d: dict[str, Any] = {"role": self.role, "content": self.text()}
        if self.tool_calls:
            d["tool_calls"] = [c.model_dump() for c in self.tool_calls]
        if self.tool_call_id is not None:
            d["tool_call_id"] = self.tool_call_id
        if self.name is not None and self.role == "tool":
            d["name"] = self.name
        return d


class FunctionDef(_Strict):
    name: str = Field(pattern=r"^[A-Za-z0-9_.\-]{1,64}$")
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None  # true: a call's arguments are constrained to `parameters`


class Tool(_Strict):
    type: Literal["function"]
    function: FunctionDef

    def to_dict(self) -> dict[str, Any]:
        """The tool as the chat template shows it to the model (`strict` is the server's)."""
        return self.model_dump(exclude_none=True, exclude={"function": {"strict"}})

    def spec(self) -> dict[str, Any]:
        """The whole tool, `strict` included, as grammar.Constraint reads it."""
        return self.model_dump(exclude_none=True)


class NamedFunction(_Strict):
    name: str


class NamedToolChoice(_Strict):
    type: Literal["function"]
    function: NamedFunction


class StreamOptions(_Strict):
    include_usage: bool = False


class Prediction(_Strict):
    """OpenAI's Predicted Outputs: text the reply is expected to repeat."""

    type: Literal["content"]
    content: str | list[TextPart]

    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)


class _GenerationFields(_Strict):
    model: str | None = None  # an id /v1/models lists picks that model; any other: the default
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=0)
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = Field(default=1, ge=1, le=1, description="only one choice is generated")
    presence_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    user: str | None = None
    # llama.cpp server names
    repeat_penalty: float | None = Field(default=None, gt=0.0, le=10.0)
    repeat_last_n: int | None = Field(default=None, ge=-1)
    # a stream tells how far the prompt's reading is, in `prompt_progress` chunks (without it:
    # SSE comments, which every client skips, keep a long read from looking like a dead server)
    return_progress: bool | None = None
    # structured output: OpenAI's response_format, llama.cpp's json_schema and grammar (GBNF)
    response_format: dict[str, Any] | None = None
    json_schema: dict[str, Any] | None = None
    grammar: str | None = None
    prediction: Prediction | None = None
    # OpenAI's: token id (as a string) -> bias in [-100, 100] added to its logit
    logit_bias: dict[str, float] | None = None
    # sprinter-edge extensions
    method: str | None = Field(default=None, description="a decoding method (auto, ar, sd, lookup, ...)")
    threshold: float | None = Field(default=None, gt=0.0, le=1.0)
    # stream each chunk's tokens with where they came from (the chat page shades them)
    origins: bool | None = None
    # the methods' own settings for this request, e.g. {"draft_len": 3} (decoding/settings.py)
    settings: dict[str, Any] | None = None

    @field_validator("method")
    @classmethod
    def _known_method(cls, value: str | None) -> str | None:
        if value is not None and value not in methods():  # the registry as it is now
            raise ValueError(f"unknown method {value!r}; choose from {', '.join(methods())}")
        return value

    @model_validator(mode="after")
    def _check_stop(self) -> _GenerationFields:
        if isinstance(self.stop, list) and len(self.stop) > 4:
            raise ValueError("stop: at most 4 sequences")
        return self

    @field_validator("logit_bias")
    @classmethod
    def _token_ids(cls, value: dict[str, float] | None) -> dict[str, float] | None:
        for key, amount in (value or {}).items():
            if not key.strip().isdigit():
                raise ValueError(f"logit_bias: keys are token ids, got {key!r}")
            if not -100 <= amount <= 100:
                raise ValueError(f"logit_bias: the bias of token {key} must be between -100 and 100")
        return value

    def bias(self) -> dict[int, float] | None:
        """logit_bias with int keys."""
        return {int(k): float(v) for k, v in self.logit_bias.items()} if self.logit_bias else None

    def stops(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice


class ChatCompletionRequest(_GenerationFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=MAX_LOGPROBS)
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool | None = None  # default: several calls may come back

    @model_validator(mode="after")
    def _check_tools(self) -> ChatCompletionRequest:
        if self.top_logprobs is not None and not self.logprobs:
            raise ValueError("top_logprobs needs logprobs: true")
        names = [t.function.name for t in self.tools or ()]
        if len(set(names)) != len(names):
            raise ValueError("tools: two tools have the same name")
        choice = self.tool_choice
        if choice is not None and choice != "none" and not names:
            raise ValueError("tool_choice needs tools")
        if isinstance(choice, NamedToolChoice) and choice.function.name not in names:
            raise ValueError(f"tool_choice names {choice.function.name!r}, which is not in tools")
        return self

    def token_limit(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    def logprobs_k(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None

    def tool_mode(self) -> tuple[str, list[str]]:
        """("off" | "auto" | "forced", the names a forced call may take)."""
        names = [t.function.name for t in self.tools or ()]
        choice = self.tool_choice or ("auto" if names else "none")
        if choice == "none" or not names:
            return "off", []
        if isinstance(choice, NamedToolChoice):
            return "forced", [choice.function.name]
        if choice == "required":
            return "forced", names
        return "auto", names


class CompletionRequest(_GenerationFields):
    prompt: str | list[str] | list[int]
    echo: bool = Field(default=False, description="not supported (must be false)")
    logprobs: int | None = Field(default=None, ge=0, le=MAX_LOGPROBS)
    suffix: None = None

    @model_validator(mode="after")
    def _check_prompt(self) -> CompletionRequest:
        if self.echo:
            raise ValueError("echo is not supported")
        if isinstance(self.prompt, list):
            if not self.prompt:
                raise ValueError("prompt must not be empty")
            if isinstance(self.prompt[0], str) and len(self.prompt) != 1:
                raise ValueError("one prompt per request (a list of one string)")
        return self

    def prompt_value(self) -> str | list[int]:
        if isinstance(self.prompt, list) and self.prompt and isinstance(self.prompt[0], str):
            return str(self.prompt[0])
        return self.prompt  # type: ignore[return-value]

    def token_limit(self) -> int | None:
        return self.max_tokens
