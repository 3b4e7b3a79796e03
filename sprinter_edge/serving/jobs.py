"""A request's life on the engine worker, seen from the event loop: queue it with its
settings, wait until the worker takes it, then collect the result or stream its chunks.

Every path ends by cancelling the job (a no-op once it is done), so a request abandoned
for any reason frees the worker at its next decoding step."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Any, Protocol

from fastapi.responses import StreamingResponse

from ..decoding import Chunk, GenerationResult, PromptProgress, SamplingParams
from ..errors import ContextOverflowError, EngineStoppedError, GrammarError, SprinterError, TargetLostError
from ..grammar import Constraint
from ..verifiers.operating_point import OperatingPoint
from .responses import (
    DONE,
    ApiError,
    Choice,
    chunk_event,
    final_events,
    generation_failed,
    progress_comment,
    progress_event,
    stream_error_event,
)
from .schemas import ChatCompletionRequest, CompletionRequest
from .supervisor import SupervisedWorker
from .tools import ToolCallError
from .worker import EngineWorker, Job


class ChunkShaper(Protocol):
    """What a stream needs from the response side: the choices of each event."""

    def opening(self) -> Choice | None: ...
    def waiting(self) -> Choice: ...
    def on_chunk(self, chunk: Chunk) -> list[Choice]: ...
    def on_done(self, result: GenerationResult) -> list[Choice]: ...


CONSTRAINT_FIELDS = ("response_format", "json_schema", "grammar")


def body_constraint(req: ChatCompletionRequest | CompletionRequest) -> Constraint | None:
    """The constraint the request's `response_format`, `json_schema` (llama.cpp's: keywords
    the grammar engine lacks are ignored, as with OpenAI's non-strict schemas) or `grammar`
    (GBNF, or Lark) asks for; None for free text. A bad one is a 400 naming its field, sent
    before the request is queued."""
    sent = [name for name in CONSTRAINT_FIELDS if getattr(req, name) is not None]
    if len(sent) > 1:
        raise ApiError(400, f"send one of response_format, json_schema and grammar, not "
                            f"{' and '.join(sent)}", param=sent[1])
    if not sent:
        return None
    name = sent[0]
    try:
        if name == "response_format":
            return Constraint.from_response_format(req.response_format)
        if name == "json_schema":
            return Constraint.json_schema(req.json_schema or {}, strict=False)
        return Constraint.grammar(req.grammar or "")
    except GrammarError as exc:
        raise ApiError(400, f"{name}: {exc}", param=name) from None


def request_params(req: ChatCompletionRequest | CompletionRequest, defaults: SamplingParams, *,
                   logprobs: int | None = None, extra_stops: Sequence[str] = (),
                   tool_constraint: Constraint | None = None
                   ) -> tuple[SamplingParams, OperatingPoint | None]:
    """The request's sampling settings (the defaults where it leaves a field out) and its
    operating point; a setting the engine refuses is a 400. `tool_constraint`: the grammar of
    a reply with tool calls (a forced call, or "auto" with a strict tool), which a
    response_format cannot also shape."""
    constraint = body_constraint(req)
    if tool_constraint is not None:
        if constraint is not None:
            field = next(name for name in CONSTRAINT_FIELDS if getattr(req, name) is not None)
            raise ApiError(400, f"{field} cannot be combined with a tool_choice that forces a "
                                "call: the reply is the call", param=field)
        constraint = tool_constraint
    fields = {"max_tokens": req.token_limit(), "temperature": req.temperature,
              "top_p": req.top_p, "top_k": req.top_k, "seed": req.seed,
              "presence_penalty": req.presence_penalty,
              "frequency_penalty": req.frequency_penalty,
              "repeat_penalty": req.repeat_penalty, "repeat_last_n": req.repeat_last_n,
              "constraint": constraint,
              "prediction": req.prediction.text() if req.prediction is not None else None,
              "logit_bias": req.bias()}
    try:
        params = defaults.replace(stop=(*req.stops(), *extra_stops), logprobs=logprobs,
                                  **{k: v for k, v in fields.items() if v is not None})
        point = OperatingPoint(threshold=req.threshold) if req.threshold is not None else None
    except SprinterError as exc:
        raise ApiError(400, str(exc)) from None
    return params, point


def submit(worker: EngineWorker | SupervisedWorker, defaults: SamplingParams,
           req: ChatCompletionRequest | CompletionRequest, prompt: Any, *, chat: bool,
           logprobs: int | None = None, extra_stops: Sequence[str] = (),
           tool_constraint: Constraint | None = None, model: str | None = None) -> Job:
    """Queue the request on the worker; `model`: the id of the model that runs it."""
    params, point = request_params(req, defaults, logprobs=logprobs, extra_stops=extra_stops,
                                   tool_constraint=tool_constraint)
    # the engine checks the settings the request names (a bad one: a 400 when the job starts);
    # the ones it leaves out keep the engine's values
    return worker.submit(prompt, params=params, chat=chat, method=req.method, operating_point=point,
                         settings=req.settings, origins=bool(req.origins), model=model)


async def wait_started(job: Job) -> None:
    """Wait until the worker has accepted the job; a refusal is a 400 (a bad request), a 503
    (no engine now: its worker process ended and is restarting, its rpc-server went away) or a
    500 (anything else)."""
    try:
        event, value = await job.events.get()
    except BaseException:
        job.cancel()
        raise
    if event == "error":
        if isinstance(value, (TargetLostError, EngineStoppedError)):  # the server's, not the request's
            raise ApiError(503, str(value), type_="server_error")
        status = 400 if isinstance(value, (SprinterError, ValueError)) else 500
        code = "context_length_exceeded" if isinstance(value, ContextOverflowError) else None
        raise ApiError(status, str(value), type_="invalid_request_error" if status == 400
                       else "server_error", code=code)


async def collect(job: Job) -> GenerationResult:
    """The started job's result."""
    try:
        while True:
            event, value = await job.events.get()
            if event == "done":
                return value
            if event == "error":
                raise generation_failed(value)
    finally:
        job.cancel()


class JobStream(StreamingResponse):
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


async def job_events(job: Job, base: dict[str, Any], shaper: ChunkShaper, *,
                     include_usage: bool, progress: bool = False) -> AsyncIterator[str]:
    """The server-sent events of a started job: one per choice `shaper` makes, the stream's
    end (usage and counters) or its error, then [DONE]. While the prompt is read, each report
    of it is a `prompt_progress` chunk (`progress`: the request's `return_progress`) or an SSE
    comment."""
    try:
        opening = shaper.opening()
        if opening is not None:
            yield chunk_event(base, [opening])
        while True:
            event, value = await job.events.get()
            try:
                if event == "chunk":
                    for choice in shaper.on_chunk(value):
                        yield chunk_event(base, [choice])
                elif event == "progress":
                    yield progress_sse(base, shaper, value, progress)
                elif event == "done":
                    for sse in final_events(base, shaper.on_done(value), value,
                                            include_usage=include_usage):
                        yield sse
                    break
            except ToolCallError as exc:
                event, value = "error", exc
            if event == "error":
                yield stream_error_event(value)
                break
        yield DONE
    finally:
        job.cancel()


def progress_sse(base: dict[str, Any], shaper: ChunkShaper, value: PromptProgress,
                 progress: bool) -> str:
    """A report of the prompt's reading: llama.cpp's chunk for the main model's read when the
    client asked for it; otherwise (or the draft's read) a comment."""
    if progress and value.main:
        return progress_event(base, shaper.waiting(), value)
    return progress_comment(value)


def stream_response(job: Job, base: dict[str, Any], shaper: ChunkShaper, *,
                    include_usage: bool, progress: bool = False) -> JobStream:
    return JobStream(job_events(job, base, shaper, include_usage=include_usage, progress=progress), job)
