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
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..api import Engine
from ..decoding import GenerationResult, SamplingParams
from ..errors import ContextOverflowError, SprinterError
from ..verifiers.operating_point import OperatingPoint
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

    def submit(req: ChatCompletionRequest | CompletionRequest, prompt: Any, *, chat: bool) -> Job:
        """Queue the request with its settings (the defaults where it leaves a field out)."""
        fields = {"max_tokens": req.token_limit(), "temperature": req.temperature,
                  "top_p": req.top_p, "top_k": req.top_k, "seed": req.seed}
        try:
            params = defaults.replace(stop=tuple(req.stops()),
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

    def stream_response(job: Job, base: dict[str, Any], choice: Callable[[str, str | None], dict],
                        *, include_usage: bool, opening: dict[str, Any] | None = None) -> _JobStream:
        """Server-sent events for one job: `choice(text, finish)` shapes each chunk's choice."""

        async def body() -> AsyncIterator[str]:
            try:
                if opening is not None:
                    yield _sse({**base, "choices": [opening]})
                while True:
                    kind, value = await job.events.get()
                    if kind == "chunk" and value.text:
                        yield _sse({**base, "choices": [choice(value.text, None)]})
                    elif kind == "done":
                        yield _sse({**base, "choices": [choice("", FINISH[value.finish_reason])],
                                    **result_extra(value)})
                        if include_usage:
                            yield _sse({**base, "choices": [], "usage": _usage(value)})
                        break
                    elif kind == "error":
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
        messages = [{"role": m.role, "content": m.text()} for m in req.messages]
        job = submit(req, messages, chat=True)
        await start(job)
        base = {"id": f"chatcmpl-{uuid.uuid4().hex}", "created": int(time.time()), "model": model_id,
                "object": "chat.completion.chunk" if req.stream else "chat.completion"}
        if not req.stream:
            result = await collect(job)
            return {**base, "choices": [{
                "index": 0, "message": {"role": "assistant", "content": result.text},
                "finish_reason": FINISH[result.finish_reason], "logprobs": None}],
                **result_extra(result)}

        def choice(text: str, finish: str | None) -> dict[str, Any]:
            delta = {"content": text} if text else {}
            return {"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}

        opening = {"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None,
                   "logprobs": None}
        return stream_response(job, base, choice, opening=opening,
                               include_usage=bool(req.stream_options and req.stream_options.include_usage))

    # ------------------------------------------------------------------ completions
    @app.post("/v1/completions")
    async def completions(req: CompletionRequest) -> Any:
        job = submit(req, req.prompt_value(), chat=False)
        await start(job)
        base = {"id": f"cmpl-{uuid.uuid4().hex}", "created": int(time.time()), "model": model_id,
                "object": "text_completion"}
        if not req.stream:
            result = await collect(job)
            return {**base, "choices": [{"index": 0, "text": result.text, "logprobs": None,
                                         "finish_reason": FINISH[result.finish_reason]}],
                    **result_extra(result)}

        def choice(text: str, finish: str | None) -> dict[str, Any]:
            return {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}

        return stream_response(job, base, choice,
                               include_usage=bool(req.stream_options and req.stream_options.include_usage))

    return app


def serve(engine: Engine, *, model_id: str, host: str = "127.0.0.1", port: int = 8000,
          defaults: SamplingParams | None = None, log_level: str = "info") -> None:
    """Load the models and serve until interrupted."""
    import uvicorn

    engine.load()
    app = create_app(engine, model_id=model_id, defaults=defaults)
    uvicorn.run(app, host=host, port=port, log_level=log_level, workers=1)
