"""The server's routes and error handlers, as module-level functions over `ServerState`
(kept in `app.state.server` by server.create_app)."""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from functools import partial
from importlib.resources import files
from typing import Any

from fastapi import APIRouter, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..api import Engine
from ..decoding import SamplingParams
from ..errors import GrammarError
from ..grammar import Constraint
from .jobs import body_constraint, collect, stream_response, submit, wait_started
from .models import ServedModels
from .responses import (
    ApiError,
    ChatChunks,
    CompletionChunks,
    chat_completion,
    envelope,
    error_response,
    generation_failed,
    models_list,
    text_completion,
    validation_message,
)
from .schemas import ChatCompletionRequest, CompletionRequest, NamedToolChoice
from .supervisor import SupervisedWorker
from .tools import (
    CLOSE,
    ToolCallError,
    ToolStream,
    needs_tool_rendering,
    parse_reply,
    tool_prompt,
)
from .worker import EngineWorker, PromptBuilder

router = APIRouter()


@dataclass
class ServerState:
    """What the handlers serve: one engine behind its worker, under one model id, or, with
    `models`, the models it offers, the default one first (serving/models.py). `engine` names
    the settings; with a worker process (supervisor.py) it is never loaded here."""

    engine: Engine
    worker: EngineWorker | SupervisedWorker
    model_id: str
    defaults: SamplingParams
    created: int  # when the server started, for /v1/models
    models: ServedModels | None = None

    def pick(self, requested: str | None) -> str:
        """The id of the model that answers a request naming `requested` (an id not offered: the
        default, as llama.cpp's server)."""
        return self.models.pick(requested) if self.models is not None else self.model_id


def state_of(request: Request) -> ServerState:
    return request.app.state.server


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    worker = app.state.server.worker
    worker.start()
    yield
    worker.stop()


# ---------------------------------------------------------------------------- errors

async def on_invalid_request(request: Request, exc: RequestValidationError) -> JSONResponse:
    return error_response(400, validation_message(exc))


async def on_http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    return error_response(exc.status_code, str(exc.detail),
                          "not_found_error" if exc.status_code == 404 else "invalid_request_error")


async def on_api_error(request: Request, exc: ApiError) -> JSONResponse:
    return exc.response()


def install_error_handlers(app: FastAPI) -> None:
    """Every error a client sees has OpenAI's error body."""
    app.add_exception_handler(RequestValidationError, on_invalid_request)  # type: ignore[arg-type]
    app.add_exception_handler(StarletteHTTPException, on_http_error)  # type: ignore[arg-type]
    app.add_exception_handler(ApiError, on_api_error)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------- status

@router.get("/", include_in_schema=False)
async def page(request: Request) -> HTMLResponse:
    """The chat page: one file, no build step and nothing fetched from elsewhere."""
    from ..methods import DEFAULT_METHOD, methods

    html = (files(__package__) / "page.html").read_text(encoding="utf-8")
    html = html.replace("__METHODS__", json.dumps(list(methods()))).replace(
        "__DEFAULT_METHOD__", json.dumps(state_of(request).engine.settings.method or DEFAULT_METHOD))
    return HTMLResponse(html)


@router.get("/health")
async def health(request: Request) -> Any:
    s = state_of(request)
    c = s.worker.counters
    body = {"status": "ok", "model": s.model_id, "method": s.engine.settings.method, "busy": c.busy,
            "queued": s.worker.queued, "completed": c.completed, "cancelled": c.cancelled,
            "failed": c.failed, "totals": c.totals(), "pid": os.getpid(), "worker_pid": s.worker.pid}
    if s.worker.state != "ready":  # as llama.cpp's server: 503 while the models load (or reload)
        body["status"] = s.worker.state
        if s.worker.load_error is not None:
            body["error"] = str(s.worker.load_error)
        return JSONResponse(body, status_code=503)
    # where the layers are (of the model that ran last): a word or two for the page, and the
    # line `--stats` prints
    placement = s.worker.placement()
    body["layers_on"], body["layers"] = placement.layers_on, placement.layers
    if placement.models_loaded is not None:
        body["models_loaded"] = placement.models_loaded
    return body


@router.get("/v1/models")
async def models(request: Request) -> dict[str, Any]:
    s = state_of(request)
    if s.models is None:
        return models_list([(s.model_id, "sprinter-edge")], s.created)
    return models_list([(i, s.models.offers[i].owned_by) for i in s.models.ids()], s.created)


# ---------------------------------------------------------------------------- chat

@dataclass
class ChatPlan:
    """How one chat request is prompted and how its reply is read for tool calls."""

    mode: str  # "off" | "auto" | "forced"
    prompt: list[dict[str, Any]] | PromptBuilder
    forced: list[str] | None = None  # the names a forced call may take
    bare_names: list[str] = field(default_factory=list)  # a bare JSON call of these counts too
    one_call: bool = False  # stop at the first call's end
    # a forced call, or "auto" with a strict tool: the reply's whole text, `<tool_call>`
    # included, is the grammar's
    constraint: Constraint | None = None

    @property
    def tools(self) -> bool:
        return self.mode != "off"

    def tool_stream(self) -> ToolStream | None:
        if not self.tools:
            return None
        return ToolStream(forced=self.forced, names=self.bare_names)


def tool_constraint(req: ChatCompletionRequest, mode: str) -> Constraint | None:
    """Checks every strict tool's schema (a 400 naming the tool if it does not compile) and
    returns the grammar of the reply: when tool_choice forces a call, one `<tool_call>` block
    of the named function or of any tool; under "auto" with a strict tool, free text or calls
    (grammar.Constraint.from_tool_choice). A strict tool's arguments follow its schema."""
    specs = [t.spec() for t in req.tools or ()] if mode != "off" else []
    for i, spec in enumerate(specs):
        if spec["function"].get("strict"):
            try:
                Constraint.tool_arguments(spec)
            except GrammarError as exc:
                raise ApiError(400, f"tools[{i}] ({spec['function']['name']}): {exc}",
                               param=f"tools[{i}].function.parameters") from None
    if mode == "auto":
        if body_constraint(req) is not None:
            return None  # the response_format shapes the reply, as without strict tools
        try:
            return Constraint.from_tool_choice(specs, "auto",
                                               parallel=req.parallel_tool_calls is not False)
        except GrammarError as exc:
            raise ApiError(400, f"tools: {exc}", param="tools") from None
    if mode != "forced":
        return None
    choice = req.tool_choice
    wanted = choice.model_dump() if isinstance(choice, NamedToolChoice) else choice
    try:
        # one call: generation stops at its </tool_call> either way (ChatPlan.one_call)
        return Constraint.from_tool_choice(specs, wanted, parallel=False)
    except GrammarError as exc:
        raise ApiError(400, f"tool_choice: {exc}", param="tool_choice") from None


def plan_chat(req: ChatCompletionRequest) -> ChatPlan:
    """The request's tool mode and prompt: plain messages for the engine's own chat rendering,
    or, with tools or tool turns, a prompt the worker renders with the model's template. A
    forced call is constrained by its grammar from the reply's first byte, so the prompt ends
    where the template leaves the assistant's turn open (no call text is written for it)."""
    messages = [m.to_dict() for m in req.messages]
    mode, names = req.tool_mode()
    plan = ChatPlan(mode=mode, prompt=messages,
                    forced=names if mode == "forced" else None,
                    bare_names=names if mode == "auto" else [],
                    # one call: the forced one, or the first when parallel calls are off
                    one_call=mode == "forced" or (mode == "auto" and req.parallel_tool_calls is False),
                    constraint=tool_constraint(req, mode))
    if plan.tools or needs_tool_rendering(messages):
        tools = [t.to_dict() for t in req.tools or ()] if plan.tools else None
        plan.prompt = partial(tool_prompt, messages, tools)  # rendered by the worker
    return plan


@router.post("/v1/chat/completions")
async def chat_completions(body: ChatCompletionRequest, request: Request) -> Any:
    s = state_of(request)
    plan = plan_chat(body)
    model_id = s.pick(body.model)
    job = submit(s.worker, s.defaults, body, plan.prompt, chat=True, logprobs=body.logprobs_k(),
                 extra_stops=(CLOSE,) if plan.one_call else (), tool_constraint=plan.constraint,
                 model=model_id)
    await wait_started(job)
    base = envelope("chatcmpl", "chat.completion.chunk" if body.stream else "chat.completion",
                    model_id)
    if body.stream:
        shaper = ChatChunks(job.pieces, logprobs=body.logprobs, tools=plan.tool_stream(),
                            origins=bool(body.origins))
        return stream_response(job, base, shaper, include_usage=_include_usage(body),
                               progress=bool(body.return_progress))
    result = await collect(job)
    if not plan.tools:
        return chat_completion(base, result, job.pieces)
    try:
        parsed = parse_reply(result.text, forced=plan.forced, names=plan.bare_names,
                             cut=result.finish_reason == "length")
    except ToolCallError as exc:
        raise generation_failed(exc) from None
    return chat_completion(base, result, job.pieces, content=parsed.content, calls=parsed.calls)


# ---------------------------------------------------------------------------- completions

@router.post("/v1/completions")
async def completions(body: CompletionRequest, request: Request) -> Any:
    s = state_of(request)
    model_id = s.pick(body.model)
    job = submit(s.worker, s.defaults, body, body.prompt_value(), chat=False, logprobs=body.logprobs,
                 model=model_id)
    await wait_started(job)
    base = envelope("cmpl", "text_completion", model_id)
    if body.stream:
        return stream_response(job, base, CompletionChunks(job.pieces),
                               include_usage=_include_usage(body), progress=bool(body.return_progress))
    return text_completion(base, await collect(job), job.pieces)


def _include_usage(req: ChatCompletionRequest | CompletionRequest) -> bool:
    return bool(req.stream_options and req.stream_options.include_usage)
