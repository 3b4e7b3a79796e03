"""`sprinter-edge serve`: an OpenAI-compatible local HTTP server (needs the `serve` extra)."""

from __future__ import annotations

import argparse
import logging
import sys
from fnmatch import fnmatch
from functools import partial
from typing import TYPE_CHECKING, Any

from ..backend.rpc import dial
from ..catalog import local
from .common import (
    add_across_requests_args,
    add_decoding_args,
    add_hardware_args,
    add_model_args,
    engine_from,
    engine_kwargs,
    sampling_from,
)
from .extras import require

if TYPE_CHECKING:
    from ..serving.engine_process import WorkerSpec
    from ..serving.models import ServedModels


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "serve", help="OpenAI-compatible local server (/v1/chat/completions, /v1/completions)",
        description="Serve a model pair over an OpenAI-compatible HTTP API: POST "
                    "/v1/chat/completions and /v1/completions (streaming with \"stream\": true), GET "
                    "/v1/models and /health. Requests run one at a time; \"model\" picks one of the "
                    "models /v1/models lists (the default pair or --target, and the GGUF models found "
                    "on this machine, loaded on first use), any other name gets the default; "
                    "\"method\" and \"threshold\" may be set per request. The decoding flags below "
                    "are the defaults for requests that leave them out.")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to bind (default: %(default)s, this machine only; 0.0.0.0 exposes "
                        "the server to the network without any authentication)")
    p.add_argument("--port", type=int, default=8000, help="TCP port (default: %(default)s)")
    p.add_argument("--model-name", default=None, metavar="ID",
                   help="the default model's id in /v1/models and replies (default: the pair name, "
                        "the name --target was given, or the target file name without .gguf)")
    p.add_argument("--models", default=None, metavar="NAMES",
                   help="the found models to offer besides the default: comma-separated names or "
                        "shell patterns (`ollama:*`, `hf:*coder*`), `none` for only the default "
                        "(default: the config file's `serve` list, else every model `sprinter-edge "
                        "models` finds)")
    p.add_argument("--log-level", default="info", choices=("critical", "error", "warning", "info", "debug"),
                   help="uvicorn log level (default: %(default)s)")
    p.add_argument("--in-process", action="store_true",
                   help="for debugging and measuring: run the engine on a thread of the server's own "
                        "process, not in a worker process the server restarts when it fails (an abort "
                        "inside llama.cpp then ends the server)")
    add_across_requests_args(p)
    add_decoding_args(p, max_tokens_default=None)
    add_model_args(p)
    add_hardware_args(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    require("`sprinter-edge serve`", "fastapi", "uvicorn")  # before any model loads
    from ..serving.server import serve

    # the server's own lines (a line per reply at info) follow --log-level, as uvicorn's do
    logging.getLogger("sprinter_edge.serving").setLevel(args.log_level.upper())

    engine = engine_from(args)
    pairing = getattr(args, "pairing", None)
    model_id = args.model_name or (engine.pair.name if engine.pair and not args.target
                                   else pairing.target.name if pairing and pairing.target.source != "path"
                                   else engine.target_path.name.removesuffix(".gguf"))
    models = served_models(args, engine, model_id)
    if args.stop:
        print("sprinter-edge serve: --stop is ignored; send \"stop\" per request", file=sys.stderr)
    defaults = sampling_from(args).replace(stop=())
    print(f"sprinter-edge serve: model {model_id!r} (method {engine.settings.method}) on "
          f"http://{args.host}:{args.port}/v1", file=sys.stderr, flush=True)
    if models is not None and len(models.offers) > 1:
        print(f"sprinter-edge serve: {len(models.offers) - 1} more models offered, loaded when a request's "
              "\"model\" names one (/v1/models lists them; --models limits them)", file=sys.stderr,
              flush=True)
    for endpoint in engine.hardware.target_rpc:  # one line now, not a failed load after listening
        dial(endpoint)
    spec = None if args.in_process else worker_spec(args, engine, models)
    serve(engine, model_id=model_id, host=args.host, port=args.port, defaults=defaults,
          log_level=args.log_level, models=models, spec=spec)
    return 0


def worker_spec(args: argparse.Namespace, engine: Any, models: ServedModels | None) -> WorkerSpec:
    """What the engine's worker process builds the same engine, and the models offered, from."""
    from ..serving.engine_process import WorkerSpec

    levels = {name: logging.getLogger(name).level
              for name in ("", "sprinter_edge.serving", "sprinter_edge.llama_cpp")}
    return WorkerSpec(engine.target_path, engine.draft_path, engine_kwargs(args), pair=engine.pair,
                      offers=tuple(models.offers.values()) if models is not None else (),
                      log_levels=levels)


def served_models(args: argparse.Namespace, engine: Any, model_id: str) -> ServedModels | None:
    """The default model and the others offered: the usable GGUF models found on this machine
    (catalog/local.py), each with the draft found for it, limited by --models or the config
    file's `serve` list. None (the default alone) with `--models none` or a target on
    rpc-servers."""
    from ..serving.models import Offer, ServedModels, offer_engine

    patterns = ([p.strip() for p in args.models.split(",") if p.strip()] if args.models is not None
                else local.load_config().get("serve"))
    if engine.hardware.target_rpc or patterns == ["none"]:
        return None
    found = local.find_models(args.models_dir)
    offers = []
    for m in found.usable():
        if patterns and not any(fnmatch(m.name, p) or fnmatch(m.short, p) for p in patterns):
            continue
        if m.same_file(engine.target_path):  # the default model answers for its own file
            continue
        draft = found.draft_for(m)
        offers.append(Offer(m.name, m.path, draft.path if draft else None, owned_by=m.source))
    for p in patterns or ():
        if not any(fnmatch(m.name, p) or fnmatch(m.short, p) for m in found.models):
            print(f"sprinter-edge serve: --models {p!r} matches none of the models found here "
                  "(`sprinter-edge models` lists them)", file=sys.stderr)
    default = Offer(model_id, engine.target_path, engine.draft_path)
    return ServedModels(default, engine, offers, make=partial(offer_engine, engine_kwargs(args)))
