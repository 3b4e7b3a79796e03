"""An OpenAI-compatible HTTP server over one loaded model pair (FastAPI).

Endpoints: POST /v1/chat/completions, POST /v1/completions (both with `stream` over SSE),
GET /v1/models, GET /health. Every response carries `usage` and the decoding counters in
an extra `sprinter` field. Requests run one at a time on a single worker thread (see
worker.py); a client that disconnects mid-stream frees the worker at the next step.
Tool calls: tools.py; logprobs: the target's, see DecodeContext.record_target; every
request field against llama.cpp's server: docs/server.md.
"""

from __future__ import annotations

import codecs
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..api import Engine
from ..decoding import Chunk, GenerationResult, SamplingParams
from ..decoding.base import TokenLogprob
from ..errors import ContextOverflowError, SprinterError
from ..prompting import prompt_tokens, render_chat
from ..verifiers.operating_point import OperatingPoint
from .schemas import ChatCompletionRequest, CompletionRequest
from .tools import (
    CLOSE,
    ToolCallError,
    ToolStream,
    forced_prefix,
    needs_tool_rendering,
    parse_reply,
    render_messages,
    template_support,
)
from .worker import EngineWorker, Job

log = logging.getLogger(__name__)

FINISH = {"stop": "stop", "length": "length", "cancelled": "stop"}


class ApiError(Exception):
    def __init__(self, status: int, message: str, *, type_: str = "invalid_request_error",
                 code: str | None = None, param: str | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.code, self.param = status, message, type_, code, param

    def response(self) -> JSONResponse:
        return error_response(self.status, self.message, self.type, self.code, self.param)


def error_response(status: int, message: str, type_: str = "invalid_request_error",
                   code: str | None = None, param: str | None = None) -> JSONResponse:
    body = {"error": {"message": message, "type": type_, "param": param, "code": code}}
    return JSONResponse(body, status_code=status)


def _validation_message(exc: RequestValidationError) -> str:
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


def _usage(result: GenerationResult) -> dict[str, int]:
    prompt, completion = result.stats.prompt_tokens, len(result.token_ids)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def _sse(data: dict[str, Any] | str) -> str:
    payload = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)
    return f"data: {payload}\n\n"


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


class _JobStream(StreamingResponse):
    """A streaming response that cancels its job however the response ends."""

    def __init__(self, content: AsyncIterator[str], job: Job):
        super().__init__(content, media_type="text/event-stream",
                         headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        self.job = job

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.job.cancel()


def create_app(engine: Engine, *, model_id: str, defaults: SamplingParams | None = None,
               worker: EngineWorker | None = None) -> FastAPI:
    """The FastAPI app serving `engine` as model `model_id`.

    `defaults` holds the sampling settings used where a request leaves a field out. Any
    `model` name is served by the one loaded pair (many clients send a fixed name, and
    llama.cpp's server does the same); responses name the served id."""
    defaults = defaults or SamplingParams()
    worker = worker or EngineWorker(engine)
    created = int(time.time())

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        worker.start()
        yield
        worker.stop()

    app = FastAPI(title="sprinter-edge", version="1", lifespan=lifespan)
    app.state.worker = worker

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        return error_response(400, _validation_message(exc))

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        return error_response(exc.status_code, str(exc.detail),
                              "not_found_error" if exc.status_code == 404 else "invalid_request_error")

    @app.exception_handler(ApiError)
    async def _api(request: Request, exc: ApiError) -> JSONResponse:
        return exc.response()

    @app.get("/health")
    async def health() -> dict[str, Any]:
        c = worker.counters
        return {"status": "ok", "model": model_id, "method": engine.settings.method, "busy": c.busy,
                "queued": worker.queued, "completed": c.completed, "cancelled": c.cancelled,
                "failed": c.failed}

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [
            {"id": model_id, "object": "model", "created": created, "owned_by": "sprinter-edge"}]}

    def submit(req: ChatCompletionRequest | CompletionRequest, prompt: Any, *, chat: bool,
               logprobs: int | None = None, extra_stops: Sequence[str] = ()) -> Job:
        """Queue the request with its settings (the defaults where it leaves a field out)."""
        fields = {"max_tokens": req.token_limit(), "temperature": req.temperature,
                  "top_p": req.top_p, "top_k": req.top_k, "seed": req.seed,
                  "presence_penalty": req.presence_penalty,
                  "frequency_penalty": req.frequency_penalty,
                  "repeat_penalty": req.repeat_penalty, "repeat_last_n": req.repeat_last_n}
        try:
            params = defaults.replace(stop=(*req.stops(), *extra_stops), logprobs=logprobs,
                                      **{k: v for k, v in fields.items() if v is not None})
            point = OperatingPoint(threshold=req.threshold) if req.threshold is not None else None
        except SprinterError as exc:
            raise ApiError(400, str(exc)) from None
        return worker.submit(prompt, params=params, chat=chat, method=req.method,
                             operating_point=point)

    async def start(job: Job) -> None:
        """Wait until the worker has accepted the job (or refused it: 400)."""
        try:
            kind, value = await job.events.get()
        except BaseException:
            job.cancel()
            raise
        if kind == "error":
            status = 400 if isinstance(value, (SprinterError, ValueError)) else 500
            code = "context_length_exceeded" if isinstance(value, ContextOverflowError) else None
            raise ApiError(status, str(value), type_="invalid_request_error" if status == 400
                           else "server_error", code=code)

    async def collect(job: Job) -> GenerationResult:
        try:
            while True:
                kind, value = await job.events.get()
                if kind == "done":
                    return value
                if kind == "error":
                    raise ApiError(500, f"generation failed: {value}", type_="server_error")
        finally:
            job.cancel()  # no-op when done; frees the worker if this request was abandoned

    def result_extra(result: GenerationResult) -> dict[str, Any]:
        return {"usage": _usage(result), "sprinter": result.stats.to_dict()}

    def stream_response(job: Job, base: dict[str, Any],
                        on_chunk: Callable[[Chunk], list[dict[str, Any]]],
                        on_done: Callable[[GenerationResult], list[dict[str, Any]]],
                        *, include_usage: bool, opening: dict[str, Any] | None = None) -> _JobStream:
        """Server-sent events for one job: `on_chunk` and `on_done` shape the choices to send
        (one event each); the last of `on_done`'s carries the usage and counters."""

        async def body() -> AsyncIterator[str]:
            try:
                if opening is not None:
                    yield _sse({**base, "choices": [opening]})
                while True:
                    kind, value = await job.events.get()
                    try:
                        if kind == "chunk":
                            for choice in on_chunk(value):
                                yield _sse({**base, "choices": [choice]})
                        elif kind == "done":
                            choices = on_done(value)
                            for choice in choices[:-1]:
                                yield _sse({**base, "choices": [choice]})
                            yield _sse({**base, "choices": choices[-1:], **result_extra(value)})
                            if include_usage:
                                yield _sse({**base, "choices": [], "usage": _usage(value)})
                            break
                    except ToolCallError as exc:
                        kind, value = "error", exc
                    if kind == "error":
                        yield _sse({"error": {"message": f"generation failed: {value}",
                                              "type": "server_error"}})
                        break
                yield _sse("[DONE]")
            finally:
                job.cancel()

        return _JobStream(body(), job)

    # ------------------------------------------------------------------ chat
    @app.post("/v1/chat/completions")
    async def chat_completions(req: ChatCompletionRequest) -> Any:
        messages = [m.to_dict() for m in req.messages]
        mode, names = req.tool_mode()
        prefix = forced_prefix(names[0] if len(names) == 1 else None) if mode == "forced" else ""
        forced = names if mode == "forced" else None
        bare_names = names if mode == "auto" else ()  # a bare JSON call of these counts too
        # one call: the forced one, or the first when parallel calls are off
        one_call = mode == "forced" or (mode == "auto" and req.parallel_tool_calls is False)
        prompt: Any = messages
        if mode != "off" or needs_tool_rendering(messages):
            tools = [t.to_dict() for t in req.tools or ()] if mode != "off" else None

            def build(engine: Engine) -> list[int]:  # runs on the worker thread
                model = engine.text_model
                msgs, template_tools = render_messages(messages, tools,
                                                       template_support(model.chat_template))
                text = render_chat(model, msgs, tools=template_tools) + prefix
                return prompt_tokens(model, text, chat_rendered=True)

            prompt = build

        job = submit(req, prompt, chat=True, logprobs=req.logprobs_k(),
                     extra_stops=(CLOSE,) if one_call else ())
        await start(job)
        base = {"id": f"chatcmpl-{uuid.uuid4().hex}", "created": int(time.time()), "model": model_id,
                "object": "chat.completion.chunk" if req.stream else "chat.completion"}

        def logprobs_of(entries: Sequence[TokenLogprob] | None) -> dict[str, Any] | None:
            if entries is None:
                return None
            return {"content": chat_logprobs(entries, job.pieces), "refusal": None}

        def finish_of(result: GenerationResult, calls: bool) -> str:
            if calls and result.finish_reason != "length":
                return "tool_calls"
            return FINISH[result.finish_reason]

        if not req.stream:
            result = await collect(job)
            message: dict[str, Any] = {"role": "assistant", "content": result.text}
            calls = []
            if mode != "off":
                try:
                    parsed = parse_reply(result.text, forced=forced, prefix=prefix, names=bare_names)
                except ToolCallError as exc:
                    raise ApiError(500, f"generation failed: {exc}", type_="server_error") from None
                calls = parsed.calls
                if calls:
                    message = {"role": "assistant", "content": parsed.content,
                               "tool_calls": [c.to_openai() for c in calls]}
            return {**base, "choices": [{
                "index": 0, "message": message, "finish_reason": finish_of(result, bool(calls)),
                "logprobs": logprobs_of(result.logprobs)}], **result_extra(result)}

        stream = ToolStream(forced=forced, prefix=prefix, names=bare_names) if mode != "off" else None
        held: list[TokenLogprob] = []  # logprobs of tokens whose text the tool parser holds

        def choice(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
            entries = list(held) if req.logprobs else None
            held.clear()
            return {"index": 0, "delta": delta, "finish_reason": finish,
                    "logprobs": logprobs_of(entries)}

        def deltas(events: list[tuple[str, Any]]) -> list[dict[str, Any]]:
            assert stream is not None
            out = []
            for kind, value in events:
                if kind == "content":
                    out.append(choice({"content": value}))
                else:
                    index = stream.calls.index(value)
                    out.append(choice({"tool_calls": [value.to_openai(index)]}))
            return out

        def on_chunk(chunk: Chunk) -> list[dict[str, Any]]:
            held.extend(chunk.logprobs or ())
            if stream is None:
                return [choice({"content": chunk.text})] if chunk.text or held else []
            return deltas(stream.feed(chunk.text))

        def on_done(result: GenerationResult) -> list[dict[str, Any]]:
            if stream is None:
                return [choice({}, FINISH[result.finish_reason])]
            out = deltas(stream.finish())
            return [*out, choice({}, finish_of(result, bool(stream.calls)))]

        opening = {"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None,
                   "logprobs": None}
        if stream is not None:
            opening = {**opening, "delta": {"role": "assistant"}}
        return stream_response(job, base, on_chunk, on_done, opening=opening,
                               include_usage=bool(req.stream_options and req.stream_options.include_usage))

    # ------------------------------------------------------------------ completions
    @app.post("/v1/completions")
    async def completions(req: CompletionRequest) -> Any:
        job = submit(req, req.prompt_value(), chat=False, logprobs=req.logprobs)
        await start(job)
        base = {"id": f"cmpl-{uuid.uuid4().hex}", "created": int(time.time()), "model": model_id,
                "object": "text_completion"}
        lp = CompletionLogprobs(job.pieces)
        if not req.stream:
            result = await collect(job)
            logprobs = lp.add(result.logprobs) if result.logprobs is not None else None
            return {**base, "choices": [{"index": 0, "text": result.text, "logprobs": logprobs,
                                         "finish_reason": FINISH[result.finish_reason]}],
                    **result_extra(result)}

        def on_chunk(chunk: Chunk) -> list[dict[str, Any]]:
            if not chunk.text and not chunk.logprobs:
                return []
            logprobs = lp.add(chunk.logprobs) if chunk.logprobs is not None else None
            return [{"index": 0, "text": chunk.text, "logprobs": logprobs, "finish_reason": None}]

        def on_done(result: GenerationResult) -> list[dict[str, Any]]:
            return [{"index": 0, "text": "", "logprobs": None,
                     "finish_reason": FINISH[result.finish_reason]}]

        return stream_response(job, base, on_chunk, on_done,
                               include_usage=bool(req.stream_options and req.stream_options.include_usage))

    return app


def serve(engine: Engine, *, model_id: str, host: str = "127.0.0.1", port: int = 8000,
          defaults: SamplingParams | None = None, log_level: str = "info") -> None:
    """Load the models and serve until interrupted."""
    import uvicorn

    engine.load()
    app = create_app(engine, model_id=model_id, defaults=defaults)
    uvicorn.run(app, host=host, port=port, log_level=log_level, workers=1)
