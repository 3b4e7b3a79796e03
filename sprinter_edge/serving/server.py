"""An OpenAI-compatible HTTP server over one loaded model pair (FastAPI).

Endpoints: POST /v1/chat/completions, POST /v1/completions (both with `stream` over SSE),
GET /v1/models, GET /health. Every response carries `usage` and the decoding counters in
an extra `sprinter` field. Requests run one at a time on a single worker thread (see
worker.py); a client that disconnects mid-stream frees the worker at the next step.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..api import Engine
from ..decoding import GenerationResult
from ..errors import ContextOverflowError, SprinterError
from .schemas import ChatCompletionRequest, CompletionRequest
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


def create_app(engine: Engine, *, model_id: str, defaults: dict[str, Any] | None = None,
               worker: EngineWorker | None = None) -> FastAPI:
    """The FastAPI app serving `engine` as model `model_id`.

    `defaults` holds the generation settings used when a request leaves them out
    (max_tokens, temperature, top_p, top_k, seed)."""
    defaults = {"max_tokens": 256, "temperature": 0.0, "top_p": 1.0, "top_k": 0, "seed": None,
                **(defaults or {})}
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

    def check_model(name: str) -> None:
        if name != model_id:
            raise ApiError(404, f"model {name!r} is not loaded; this server serves {model_id!r}",
                           type_="not_found_error", code="model_not_found", param="model")

    def gen_kwargs(req: ChatCompletionRequest | CompletionRequest, *, chat: bool) -> dict[str, Any]:
        def pick(name: str, value: Any) -> Any:
            return defaults[name] if value is None else value

        return {
            "max_tokens": pick("max_tokens", req.token_limit()),
            "temperature": pick("temperature", req.temperature),
            "top_p": pick("top_p", req.top_p), "top_k": pick("top_k", req.top_k),
            "seed": pick("seed", req.seed), "stop": req.stops(), "chat": chat,
            "method": req.method, "threshold": req.threshold,
        }

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

    async def events(job: Job) -> AsyncIterator[tuple[str, Any]]:
        try:
            while True:
                kind, value = await job.events.get()
                yield kind, value
                if kind in ("done", "error"):
                    return
        finally:
            job.cancel()

    def result_extra(result: GenerationResult) -> dict[str, Any]:
        return {"usage": _usage(result), "sprinter": result.stats.to_dict()}

    # ------------------------------------------------------------------ chat
    @app.post("/v1/chat/completions")
    async def chat_completions(req: ChatCompletionRequest) -> Any:
        check_model(req.model)
        messages = [{"role": m.role, "content": m.text()} for m in req.messages]
        job = worker.submit(messages, **gen_kwargs(req, chat=True))
        await start(job)
        rid, now = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
        base = {"id": rid, "created": now, "model": model_id}
        if not req.stream:
            result = await collect(job)
            return {**base, "object": "chat.completion", "choices": [{
                "index": 0, "message": {"role": "assistant", "content": result.text},
                "finish_reason": FINISH[result.finish_reason], "logprobs": None}],
                **result_extra(result)}
        include_usage = bool(req.stream_options and req.stream_options.include_usage)

        def chunk(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> str:
            return _sse({**base, "object": "chat.completion.chunk", "choices": [
                {"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}], **extra})

        async def body() -> AsyncIterator[str]:
            yield chunk({"role": "assistant", "content": ""})
            async for kind, value in events(job):
                if kind == "chunk" and value.text:
                    yield chunk({"content": value.text})
                elif kind == "done":
                    yield chunk({}, FINISH[value.finish_reason], **result_extra(value))
                    if include_usage:
                        yield _sse({**base, "object": "chat.completion.chunk", "choices": [],
                                    "usage": _usage(value)})
                elif kind == "error":
                    yield _sse({"error": {"message": f"generation failed: {value}",
                                          "type": "server_error"}})
            yield _sse("[DONE]")

        return _JobStream(body(), job)

    # ------------------------------------------------------------------ completions
    @app.post("/v1/completions")
    async def completions(req: CompletionRequest) -> Any:
        check_model(req.model)
        job = worker.submit(req.prompt_value(), **gen_kwargs(req, chat=False))
        await start(job)
        rid, now = f"cmpl-{uuid.uuid4().hex}", int(time.time())
        base = {"id": rid, "created": now, "model": model_id, "object": "text_completion"}
        if not req.stream:
            result = await collect(job)
            return {**base, "choices": [{"index": 0, "text": result.text, "logprobs": None,
                                         "finish_reason": FINISH[result.finish_reason]}],
                    **result_extra(result)}
        include_usage = bool(req.stream_options and req.stream_options.include_usage)

        def chunk(text: str, finish: str | None = None, **extra: Any) -> str:
            return _sse({**base, "choices": [{"index": 0, "text": text, "logprobs": None,
                                              "finish_reason": finish}], **extra})

        async def body() -> AsyncIterator[str]:
            async for kind, value in events(job):
                if kind == "chunk" and value.text:
                    yield chunk(value.text)
                elif kind == "done":
                    yield chunk("", FINISH[value.finish_reason], **result_extra(value))
                    if include_usage:
                        yield _sse({**base, "choices": [], "usage": _usage(value)})
                elif kind == "error":
                    yield _sse({"error": {"message": f"generation failed: {value}",
                                          "type": "server_error"}})
            yield _sse("[DONE]")

        return _JobStream(body(), job)

    return app


def serve(engine: Engine, *, model_id: str, host: str = "127.0.0.1", port: int = 8000,
          defaults: dict[str, Any] | None = None, log_level: str = "info") -> None:
    """Load the models and serve until interrupted."""
    import uvicorn

    engine.load()
    app = create_app(engine, model_id=model_id, defaults=defaults)
    uvicorn.run(app, host=host, port=port, log_level=log_level, workers=1)
