"""An OpenAI-compatible HTTP server over one loaded model pair (FastAPI).

Endpoints: POST /v1/chat/completions, POST /v1/completions (both with `stream` over SSE),
GET /v1/models, GET /health. Every response carries `usage` and the decoding counters in
an extra `decoding` field. Requests run one at a time on a single worker thread (see
worker.py); a client that disconnects mid-stream frees the worker at the next step.
Routes: handlers.py; response shapes: responses.py; tool calls: tools.py; logprobs: the
target's, see DecodeContext.record_target; every request field against llama.cpp's
server: docs/server.md.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from fastapi import FastAPI

from ..api import Engine
from ..decoding import SamplingParams
from ..errors import TargetLostError
from .handlers import ServerState, install_error_handlers, lifespan, router
from .models import ServedModels
from .worker import EngineWorker


def create_app(engine: Engine, *, model_id: str, defaults: SamplingParams | None = None,
               worker: EngineWorker | None = None, models: ServedModels | None = None) -> FastAPI:
    """The FastAPI app serving `engine` as model `model_id`, and with `models` the others it
    offers (serving/models.py).

    `defaults` holds the sampling settings used where a request leaves a field out. A `model`
    name the server does not offer is served by the default model (many clients send a fixed
    name, and llama.cpp's server does the same); responses name the id that ran."""
    worker = worker or EngineWorker(engine, models=models)
    app = FastAPI(title="sprinter-edge", version="1", lifespan=lifespan)
    app.state.server = ServerState(engine=engine, worker=worker, model_id=model_id,
                                   defaults=defaults or SamplingParams(), created=int(time.time()),
                                   models=models)
    app.state.worker = worker
    install_error_handlers(app)
    app.include_router(router)
    return app


def serve(engine: Engine, *, model_id: str, host: str = "127.0.0.1", port: int = 8000,
          defaults: SamplingParams | None = None, log_level: str = "info",
          on_target_lost: Callable[[tuple[str, ...]], None] | None = None,
          models: ServedModels | None = None) -> None:
    """Serve until interrupted: listening at once, the models loading on the worker thread
    (/health says "loading" with a 503 until they are; requests wait in line). A target on
    rpc-servers that go away ends the running reply with an error and answers every request
    after it with a 503; `on_target_lost(endpoints)` is then called (e.g. to restart when they
    are back)."""
    import uvicorn

    worker = EngineWorker(engine, prepare=engine.load, models=models)
    if engine.hardware.target_rpc:
        from ..backend import rpc

        def lost(exc: TargetLostError) -> None:
            worker.lose_target(exc)
            if on_target_lost is not None and not exc.at_load:  # a wrong port stays wrong
                on_target_lost(engine.hardware.target_rpc)

        rpc.on_lost(lost)
    app = create_app(engine, model_id=model_id, defaults=defaults, worker=worker, models=models)
    uvicorn.run(app, host=host, port=port, log_level=log_level, workers=1)
