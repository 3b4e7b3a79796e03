"""The shapes of OpenAI's responses: envelopes, choices, stream chunks, usage, logprobs,
finish reasons, error bodies and server-sent-event framing.

Everything a client reads is built here, so the handlers (handlers.py) only decide which
pieces to send and when."""

from __future__ import annotations

import codecs
import json
import time
import uuid
from collections.abc import Sequence
from typing import Any

from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from ..decoding import Chunk, GenerationResult, PromptProgress, TokenLogprob
from ..errors import EngineStoppedError
from .tools import ToolCall, ToolStream

FINISH = {"stop": "stop", "length": "length", "cancelled": "stop"}
DONE = "data: [DONE]\n\n"

Choice = dict[str, Any]


# ---------------------------------------------------------------------------- errors

class ApiError(Exception):
    """A request that ends in an OpenAI error body with this status."""

    def __init__(self, status: int, message: str, *, type_: str = "invalid_request_error",
                 code: str | None = None, param: str | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.code, self.param = status, message, type_, code, param

    def response(self) -> JSONResponse:
        return error_response(self.status, self.message, self.type, self.code, self.param)


def error_body(message: str, type_: str = "invalid_request_error", code: str | None = None,
               param: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def error_response(status: int, message: str, type_: str = "invalid_request_error",
                   code: str | None = None, param: str | None = None) -> JSONResponse:
    return JSONResponse(error_body(message, type_, code, param), status_code=status)


def generation_failed(exc: BaseException) -> ApiError:
    """A started reply that failed: a 500, or a 503 where the engine's worker ended under it
    (serving/supervisor.py: a new one is loading)."""
    return ApiError(503 if isinstance(exc, EngineStoppedError) else 500, f"generation failed: {exc}",
                    type_="server_error")


def validation_message(exc: RequestValidationError) -> str:
    """One line naming every invalid field (pydantic's own report is a list of dicts)."""
    parts = []
    for err in exc.errors():
        loc = ".".join(str(x) for x in err.get("loc", ()) if x != "body")
        if err.get("type") == "json_invalid":
            return "the request body is not valid JSON"
        if err.get("type") == "extra_forbidden":
            parts.append(f"unknown field {loc!r}")
        else:
            parts.append(f"{loc or 'body'}: {err.get('msg')}")
    return "; ".join(parts) or "invalid request"


# ---------------------------------------------------------------------------- envelopes

def envelope(id_prefix: str, object_: str, model_id: str) -> dict[str, Any]:
    """The fields every response and every chunk of one stream share."""
    return {"id": f"{id_prefix}-{uuid.uuid4().hex}", "created": int(time.time()),
            "model": model_id, "object": object_}


def models_list(models: Sequence[tuple[str, str]], created: int) -> dict[str, Any]:
    """OpenAI's model list: (id, owned_by) of each model, in order."""
    return {"object": "list", "data": [
        {"id": model_id, "object": "model", "created": created, "owned_by": owner}
        for model_id, owner in models]}


def usage(result: GenerationResult) -> dict[str, Any]:
    """OpenAI's usage; `prompt_tokens_details.cached_tokens` counts the prompt tokens found in
    the KV cache or the prompt cache (not read anew), as OpenAI and llama.cpp's server report
    them; with a prediction, `completion_tokens_details` counts its tokens found in the reply
    (accepted) and the rest (rejected), as OpenAI's Predicted Outputs do."""
    prompt, completion = result.stats.prompt_tokens, len(result.token_ids)
    out: dict[str, Any] = {"prompt_tokens": prompt, "completion_tokens": completion,
                           "total_tokens": prompt + completion}
    if result.stats.cached_tokens is not None:
        out["prompt_tokens_details"] = {"cached_tokens": result.stats.cached_tokens}
    if result.stats.prediction is not None:
        out["completion_tokens_details"] = {
            "accepted_prediction_tokens": result.stats.prediction.accepted_prediction_tokens,
            "rejected_prediction_tokens": result.stats.prediction.rejected_prediction_tokens}
    return out


def result_extra(result: GenerationResult) -> dict[str, Any]:
    """What a whole response (or a stream's last choice) adds: usage and the decoding counters."""
    return {"usage": usage(result), "decoding": result.stats.to_dict()}


def finish_reason(result: GenerationResult, *, tool_calls: bool = False) -> str:
    """OpenAI's finish reason: a reply that made tool calls ends in "tool_calls" unless the
    token budget cut it."""
    if tool_calls and result.finish_reason != "length":
        return "tool_calls"
    return FINISH[result.finish_reason]


# ---------------------------------------------------------------------------- logprobs

def _piece(pieces: dict[int, bytes], token: int) -> tuple[str, bytes]:
    raw = pieces.get(token, b"")
    return raw.decode("utf-8", errors="replace"), raw


def chat_logprobs(entries: Sequence[TokenLogprob], pieces: dict[int, bytes]) -> list[dict[str, Any]]:
    """OpenAI's chat `logprobs.content` items."""
    def item(token: int, logprob: float) -> dict[str, Any]:
        text, raw = _piece(pieces, token)
        return {"token": text, "logprob": logprob, "bytes": list(raw)}

    return [{**item(e.token, e.logprob), "top_logprobs": [item(t, lp) for t, lp in e.top]}
            for e in entries]


def chat_logprobs_object(entries: Sequence[TokenLogprob] | None,
                         pieces: dict[int, bytes]) -> dict[str, Any] | None:
    """A chat choice's `logprobs` (None when the request did not ask for them)."""
    if entries is None:
        return None
    return {"content": chat_logprobs(entries, pieces), "refusal": None}


class CompletionLogprobs:
    """OpenAI's legacy completions `logprobs` object, built chunk by chunk (text_offset counts
    characters of the completion text, from 0)."""

    def __init__(self, pieces: dict[int, bytes]):
        self.pieces = pieces
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._offset = 0

    def add(self, entries: Sequence[TokenLogprob]) -> dict[str, Any]:
        out: dict[str, Any] = {"tokens": [], "token_logprobs": [], "top_logprobs": [],
                               "text_offset": []}
        for e in entries:
            text, raw = _piece(self.pieces, e.token)
            out["tokens"].append(text)
            out["token_logprobs"].append(e.logprob)
            top = {_piece(self.pieces, t)[0]: lp for t, lp in e.top}
            top.setdefault(text, e.logprob)  # the chosen token is always there
            out["top_logprobs"].append(top)
            out["text_offset"].append(self._offset)
            self._offset += len(self._decoder.decode(raw))
        return out

    def maybe_add(self, entries: Sequence[TokenLogprob] | None) -> dict[str, Any] | None:
        return self.add(entries) if entries is not None else None


# ---------------------------------------------------------------------------- whole responses

def chat_completion(base: dict[str, Any], result: GenerationResult, pieces: dict[int, bytes], *,
                    content: str | None = None, calls: Sequence[ToolCall] = ()) -> dict[str, Any]:
    """A whole chat reply; with `calls`, `content` is the text beside them."""
    message: dict[str, Any] = {"role": "assistant", "content": result.text}
    if calls:
        message = {"role": "assistant", "content": content,
                   "tool_calls": [c.to_openai() for c in calls]}
    choice = {"index": 0, "message": message,
              "finish_reason": finish_reason(result, tool_calls=bool(calls)),
              "logprobs": chat_logprobs_object(result.logprobs, pieces)}
    return {**base, "choices": [choice], **result_extra(result)}


def text_completion(base: dict[str, Any], result: GenerationResult,
                    pieces: dict[int, bytes]) -> dict[str, Any]:
    logprobs = CompletionLogprobs(pieces).maybe_add(result.logprobs)
    choice = {"index": 0, "text": result.text, "logprobs": logprobs,
              "finish_reason": FINISH[result.finish_reason]}
    return {**base, "choices": [choice], **result_extra(result)}


# ---------------------------------------------------------------------------- streams

def sse(data: dict[str, Any] | str) -> str:
    """One server-sent event."""
    payload = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)
    return f"data: {payload}\n\n"


def chunk_event(base: dict[str, Any], choices: list[Choice], **extra: Any) -> str:
    return sse({**base, "choices": choices, **extra})


def final_events(base: dict[str, Any], choices: list[Choice], result: GenerationResult, *,
                 include_usage: bool) -> list[str]:
    """The events of a stream's end: one per choice, the last with the usage and counters, then
    (when the client asked with stream_options) OpenAI's usage-only chunk."""
    events = [chunk_event(base, [choice]) for choice in choices[:-1]]
    events.append(chunk_event(base, choices[-1:], **result_extra(result)))
    if include_usage:
        events.append(chunk_event(base, [], usage=usage(result)))
    return events


def progress_event(base: dict[str, Any], choice: Choice, progress: PromptProgress) -> str:
    """llama.cpp server's chunk for a stream that asked `return_progress`: a choice that says
    nothing yet, and `prompt_progress` (processed of total tokens in the KV cache, cache of them
    found there before the read; time_ms since it began)."""
    return chunk_event(base, [choice], prompt_progress={
        "total": progress.total, "cache": progress.cache, "processed": progress.processed,
        "time_ms": round(progress.seconds * 1000)})


def progress_comment(progress: PromptProgress) -> str:
    """The same as an SSE comment, which every client skips: the bytes alone keep a client's
    read timeout from firing while a long prompt is read."""
    who = "" if progress.main else f"the {progress.role} "
    return f": {who}reading the prompt {progress.processed}/{progress.total}\n\n"


def stream_error_event(exc: BaseException) -> str:
    """A failure after the stream began (the status line is already sent)."""
    return sse({"error": {"message": f"generation failed: {exc}", "type": "server_error"}})


class ChatChunks:
    """Turns a chat job's chunks into `chat.completion.chunk` choices. With tools, the text goes
    through a ToolStream, and the logprobs of tokens whose text it holds back wait for the
    delta that carries that text."""

    def __init__(self, pieces: dict[int, bytes], *, logprobs: bool, tools: ToolStream | None,
                 origins: bool = False):
        self.pieces, self.logprobs, self.tools, self.origins = pieces, logprobs, tools, origins
        self._held: list[TokenLogprob] = []
        # a character split across tokens shows with the token that completes it
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def opening(self) -> Choice:
        delta = {"role": "assistant"} if self.tools is not None else {"role": "assistant", "content": ""}
        return {"index": 0, "delta": delta, "finish_reason": None, "logprobs": None}

    def waiting(self) -> Choice:
        """The choice of a progress chunk, as llama.cpp's server sends it."""
        return {"index": 0, "delta": {"role": "assistant", "content": None}, "finish_reason": None,
                "logprobs": None}

    def on_chunk(self, chunk: Chunk) -> list[Choice]:
        self._held.extend(chunk.logprobs or ())
        if self.tools is None:
            delta: dict[str, Any] = {"content": chunk.text}
            if self.origins:  # each token's text and origin (sprinter-edge's extension)
                delta["origins"] = [[self._decoder.decode(self.pieces.get(t, b"")), o.value]
                                    for t, o in zip(chunk.token_ids, chunk.origins, strict=True)]
            return [self._choice(delta)] if chunk.text or self._held or self.origins else []
        return self._deltas(self.tools.feed(chunk.text))

    def on_done(self, result: GenerationResult) -> list[Choice]:
        """The last deltas and the finishing choice (may raise ToolCallError)."""
        if self.tools is None:
            return [self._choice({}, FINISH[result.finish_reason])]
        out = self._deltas(self.tools.finish(cut=result.finish_reason == "length"))
        return [*out, self._choice({}, finish_reason(result, tool_calls=bool(self.tools.calls)))]

    def _choice(self, delta: dict[str, Any], finish: str | None = None) -> Choice:
        entries = list(self._held) if self.logprobs else None
        self._held.clear()
        return {"index": 0, "delta": delta, "finish_reason": finish,
                "logprobs": chat_logprobs_object(entries, self.pieces)}

    def _deltas(self, events: list[tuple[str, Any]]) -> list[Choice]:
        assert self.tools is not None
        out = []
        for event, value in events:
            if event == "content":
                out.append(self._choice({"content": value}))
            else:
                index = self.tools.calls.index(value)
                out.append(self._choice({"tool_calls": [value.to_openai(index)]}))
        return out


class CompletionChunks:
    """Turns a completions job's chunks into `text_completion` stream choices."""

    def __init__(self, pieces: dict[int, bytes]):
        self._logprobs = CompletionLogprobs(pieces)

    def opening(self) -> Choice | None:
        return None

    def waiting(self) -> Choice:
        return {"index": 0, "text": "", "logprobs": None, "finish_reason": None}

    def on_chunk(self, chunk: Chunk) -> list[Choice]:
        if not chunk.text and not chunk.logprobs:
            return []
        return [{"index": 0, "text": chunk.text, "logprobs": self._logprobs.maybe_add(chunk.logprobs),
                 "finish_reason": None}]

    def on_done(self, result: GenerationResult) -> list[Choice]:
        return [{"index": 0, "text": "", "logprobs": None,
                 "finish_reason": FINISH[result.finish_reason]}]
