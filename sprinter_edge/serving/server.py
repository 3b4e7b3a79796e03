"""An OpenAI-compatible HTTP server over one loaded model pair (FastAPI).

Endpoints: POST /v1/chat/completions, POST /v1/completions (both with `stream` over SSE),
GET /v1/models, GET /health. Every response carries `usage` and the decoding counters in
an extra `decoding` field. Requests run one at a time on the engine's worker (worker.py): in a
process of its own that the server restarts when it ends (engine_process.py, supervisor.py), so
that nothing llama.cpp does takes the server down; a client that disconnects mid-stream frees
the worker at the next step. Routes: handlers.py; response shapes: responses.py; tool calls:
tools.py; logprobs: the target's, see DecodeContext.record_target; every request field against
llama.cpp's server: docs/server.md.
"""

from __future__ import annotations

import os
import time

from fastapi import FastAPI

from ..api import Engine
from ..decoding import SamplingParams
from .engine_process import WorkerSpec
from .handlers import ServerState, install_error_handlers, lifespan, router
from .models import ServedModels
from .supervisor import STALL_ENV, STALL_SECONDS, SupervisedWorker
from .worker import EngineWorker


def create_app(engine: Engine, *, model_id: str, defaults: SamplingParams | None = None,
               worker: EngineWorker | SupervisedWorker | None = None,
               models: ServedModels | None = None) -> FastAPI:
    """The FastAPI app serving `engine` as model `model_id`, and with `models` the others it
    offers (serving/models.py). Without `worker`, the engine runs on a thread of this process.

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
          models: ServedModels | None = None, spec: WorkerSpec | None = None) -> None:
    """Serve until interrupted: listening at once, the models loading in the worker process
    `spec` describes (/health says "loading" with a 503 until they are; requests wait in line).
    A worker that ends (an abort, a kill, a lost rpc-server) ends its requests with an error and
    is replaced (supervisor.py); `engine` here only names the settings and is never loaded.
    Without `spec` (`serve --in-process`, for debugging and measuring the worker's cost) the
    engine runs on a thread of this process, and an abort ends the server."""
    import uvicorn

    worker: EngineWorker | SupervisedWorker
    if spec is None:
        worker = EngineWorker(engine, prepare=engine.load, models=models)
    else:
        endpoints = engine.hardware.target_rpc
        stall = os.environ.get(STALL_ENV)
        worker = SupervisedWorker(spec, endpoints=endpoints,
                                  stall=float(stall) if stall else STALL_SECONDS if endpoints else None)
    app = create_app(engine, model_id=model_id, defaults=defaults, worker=worker, models=models)
    uvicorn.run(app, host=host, port=port, log_level=log_level, workers=1)
