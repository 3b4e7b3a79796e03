"""Flags shared by the subcommands, and turning them into an Engine."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Any

from ..api import DEFAULT_METHOD, Engine, Hardware
from ..backend import native
from ..backend.llama import AUTO_CTX, AUTO_CTX_MEMORY, FLASH_ATTN, default_gpu_layers
from ..backend.rpc import parse_endpoints
from ..catalog.local import Pairing, pair
from ..decoding import SamplingParams, all_settings
from ..decoding.proposers.reply_memory import DEFAULT_TOKENS
from ..errors import GrammarError, SettingsError
from ..grammar import Constraint
from ..methods import described, get_strategy, methods
from ..verifiers.calibration import PRESETS


def add_model_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("models")
    g.add_argument("--pair", default="default",
                   help="registered pair name (see `sprinter-edge models`); default: %(default)s")
    g.add_argument("--draft", metavar="MODEL",
                   help="draft: a GGUF path or a name `sprinter-edge models` lists (with --target; default: "
                        "the smallest model here, smaller than the target, with its tokenizer; none: "
                        "no draft)")
    g.add_argument("--target", metavar="MODEL",
                   help="target: a GGUF path or a name `sprinter-edge models` lists, e.g. "
                        "ollama:qwen2.5-coder:7b, lmstudio:REPO/FILE, hf:REPO/FILE (overrides --pair)")
    g.add_argument("--models-dir", action="append", default=[], metavar="DIR",
                   help="another folder of GGUF files to find models in (repeatable; also "
                        "SPRINTER_EDGE_MODELS_DIRS and the config file's dirs)")
    g.add_argument("--offline", action="store_true",
                   help="never touch the network: use cached files or the PyPI mirror only")


def add_hardware_args(p: argparse.ArgumentParser, *, ctx_default: int | None = None) -> None:
    g = p.add_argument_group("hardware")
    g.add_argument("--threads", type=int, default=None,
                   help="CPU threads per model (default: the performance cores, as llama.cpp counts "
                        "them: physical cores, no hyperthreads or efficiency cores)")
    g.add_argument("--ctx", type=int, default=ctx_default, metavar="TOKENS",
                   help=f"context size in tokens (default: {ctx_default})" if ctx_default else
                   f"context size in tokens (default: the model's trained context up to {AUTO_CTX}, "
                   "enough for an agent's request, its file and the file back; less where its KV "
                   f"cache would not fit in {AUTO_CTX_MEMORY * 100:g}%% of free memory. The default "
                   f"pair's target needs 28 KiB a token: ~450 MiB at {AUTO_CTX})")
    where = g.add_mutually_exclusive_group()
    where.add_argument("--gpu", action="store_true",
                       help="every layer of both models on the GPU (Metal/CUDA/Vulkan): the default "
                            "where the build has a GPU here; `doctor` says whether it does")
    where.add_argument("--cpu", action="store_true",
                       help="keep every layer of both models on the CPU, even where the build has a GPU")
    g.add_argument("--draft-gpu-layers", type=int, default=None,
                   help="draft layers on the GPU (0 = CPU, -1 = all)")
    g.add_argument("--target-gpu-layers", type=int, default=None,
                   help="target layers on the GPU (0 = CPU, -1 = all)")
    g.add_argument("--target-rpc", metavar="HOST:PORT[,HOST:PORT]", default=None,
                   help="put every target layer on these llama.cpp rpc-servers (`ggml-rpc-server -H "
                        "HOST -p PORT` on the machine with the memory or the GPU; docs/rpc.md); the "
                        "draft, the verifier and the copy stay here. The port is unauthenticated: "
                        "bind it to a private address")
    g.add_argument("--flash-attn", choices=FLASH_ATTN, default="auto",
                   help="flash attention; auto: off where every layer runs on the CPU and llama.cpp "
                        "repacked the weights (there a batched call at depth costs less without it), "
                        "llama.cpp's choice otherwise (default: %(default)s)")


def add_decoding_args(p: argparse.ArgumentParser, *, method_default: str = DEFAULT_METHOD,
                      max_tokens_default: int | None = SamplingParams.max_tokens) -> None:
    g = p.add_argument_group("decoding")
    g.add_argument("--method", choices=methods(), default=method_default,
                   help=f"{described()}. Default: %(default)s")
    g.add_argument("--max-tokens", type=int, default=max_tokens_default, metavar="N",
                   help="new tokens at most (default: %(default)s)" if max_tokens_default else
                   "new tokens at most for a request that names none (default: no cap, as OpenAI "
                   "and llama.cpp's server: a reply runs to its end or the context's)")
    g.add_argument("--temperature", type=float, default=SamplingParams.temperature,
                   help="0 = greedy (default); >0 samples")
    g.add_argument("--top-k", type=int, default=SamplingParams.top_k,
                   help="keep the k most likely tokens (0 = off)")
    g.add_argument("--top-p", type=float, default=SamplingParams.top_p,
                   help="nucleus sampling mass (1 = off)")
    g.add_argument("--seed", type=int, default=None, help="random seed for sampling")
    g.add_argument("--stop", action="append", default=[], metavar="TEXT",
                   help="stop when this text appears (repeatable)")
    g.add_argument("--presence-penalty", type=float, default=SamplingParams.presence_penalty,
                   metavar="X", help="OpenAI's: lower every token the reply already has by X, "
                                     "in [-2, 2] (0 = off)")
    g.add_argument("--frequency-penalty", type=float, default=SamplingParams.frequency_penalty,
                   metavar="X", help="OpenAI's: lower each token by X times its count in the reply "
                                     "so far, in [-2, 2] (0 = off)")
    g.add_argument("--repeat-penalty", type=float, default=SamplingParams.repeat_penalty,
                   metavar="X", help="llama.cpp's: divide positive logits (multiply negative ones) "
                                     "of the tokens in the last --repeat-last-n tokens, prompt "
                                     "included, by X (1 = off)")
    g.add_argument("--repeat-last-n", type=int, default=SamplingParams.repeat_last_n, metavar="N",
                   help="the repeat penalty's window (default: %(default)s; -1 = the whole "
                        "context, 0 = off)")
    g.add_argument("--verifier", default="auto",
                   help="sprinter verifier: auto (the pair's trained one, else the confidence "
                        "rule), hidden (the pair's hidden-state option, where it ships one), confidence, "
                        "always-flag, never-flag, or a path to an .onnx file")
    point = g.add_mutually_exclusive_group()
    point.add_argument("--threshold", type=float, default=None,
                       help="sprinter: flag a token when its score is below this, in (0, 1] "
                            "(default: the verifier's calibrated value)")
    point.add_argument("--preset", choices=PRESETS, default=None,
                       help="sprinter: pick the threshold from the verifier's calibration table")
    point.add_argument("--max-fp-rate", type=float, default=None, metavar="X",
                       help="sprinter: the lowest threshold whose held-out false-pass rate eta_FP "
                            "(wrong draft tokens passed) is at most X (needs a trained verifier)")
    add_method_settings(g)
    g.add_argument("--prediction", metavar="FILE", default=None,
                   help="text the reply is expected to repeat, e.g. the file being edited (OpenAI's "
                        "Predicted Outputs): copied spans of it are proposed first; the output is "
                        "unchanged, only faster where it matches")
    shape = g.add_mutually_exclusive_group()
    shape.add_argument("--json-schema", metavar="FILE|JSON", default=None,
                       help="constrain the reply to JSON valid under this schema: a path to a "
                            ".json file, or the schema as inline JSON text; keywords the grammar "
                            "engine does not implement are an error. Exact under every method")
    shape.add_argument("--grammar", metavar="FILE", default=None,
                       help="constrain the reply to a grammar file: llama.cpp GBNF (`root ::= ...`) "
                            "or llguidance Lark (`start: ...`), told apart by those rules")
    shape.add_argument("--regex", metavar="PATTERN", default=None,
                       help="constrain the whole reply to match PATTERN (Rust regex syntax, no "
                            "look-arounds)")


def add_method_settings(g: argparse._ArgumentGroup) -> None:
    """One flag per setting a registered method declares (decoding/settings.py)."""
    for s in all_settings().values():
        if s.cli:
            default = 0 if s.none_ok and s.default is None else s.default
            g.add_argument(s.flag, type=s.type, default=default, dest=s.name,
                           help=f"{s.help} (default: %(default)s)")


def method_settings_from(args: argparse.Namespace) -> dict[str, Any]:
    """The methods' settings the flags give (a flag this command lacks: left to the default)."""
    out: dict[str, Any] = {}
    for s in all_settings().values():
        if s.cli and hasattr(args, s.name):
            value = getattr(args, s.name)
            if s.none_ok and value == 0:  # the CLI's 0 means none
                value = None
            out[s.name] = s.check(value)
    return out


def add_across_requests_args(p: argparse.ArgumentParser) -> None:
    """What a server or a chat keeps from one request to the next."""
    p.add_argument("--cache-ram", type=float, default=1024, metavar="MIB",
                   help="RAM for the KV state of recent prompts, kept across requests and "
                        "conversations: a turn after another conversation's request reads only its "
                        "new tokens, as llama-server's --cache-ram (default: %(default)s; 0: off)")
    p.add_argument("--reply-memory", type=int, default=DEFAULT_TOKENS, metavar="TOKENS",
                   help="earlier replies kept as a copy source for the next requests (an agent's "
                        "replies recur in shape: a plan's sentence, a file's fence, a commit "
                        "message), in tokens; the output is the same either way "
                        "(default: %(default)s; 0: off)")


def read_text(path: str, what: str) -> str:
    """A text file the user named, or one clear error."""
    try:
        return Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise SettingsError(f"cannot read {what} {path}: {exc}") from None


def json_schema_text(value: str) -> str:
    """--json-schema's schema text: the file it names, else the value itself when it is JSON
    (a schema is an object or a boolean), else one error saying neither worked."""
    if Path(value).is_file():
        return read_text(value, "--json-schema")
    if value.lstrip().startswith("{") or value.strip() in ("true", "false"):
        return value
    raise SettingsError(f"--json-schema {value}: no such file, and not inline JSON")


def constraint_from(args: argparse.Namespace) -> Constraint | None:
    """The --json-schema / --grammar / --regex constraint (a bad one is a GrammarError: exit 2,
    before any model loads)."""
    schema, grammar, regex = (getattr(args, name, None) for name in ("json_schema", "grammar", "regex"))
    try:
        if schema is not None:
            return Constraint.json_schema(json_schema_text(schema))
        if grammar is not None:
            return Constraint.grammar(read_text(grammar, "--grammar"))
        if regex is not None:
            return Constraint.regex(regex)
    except GrammarError as exc:
        flag = "--json-schema" if schema is not None else "--grammar" if grammar is not None else "--regex"
        raise GrammarError(f"{flag}: {exc}") from None
    return None


def sampling_from(args: argparse.Namespace) -> SamplingParams:
    prediction = getattr(args, "prediction", None)
    return SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, top_k=args.top_k,
                          top_p=args.top_p, seed=args.seed, stop=tuple(args.stop),
                          presence_penalty=args.presence_penalty,
                          frequency_penalty=args.frequency_penalty,
                          repeat_penalty=args.repeat_penalty, repeat_last_n=args.repeat_last_n,
                          constraint=constraint_from(args),
                          prediction=read_text(prediction, "--prediction") if prediction else None)


def gpu_layers_from(args: argparse.Namespace) -> int:
    """The GPU layers of a model whose own --*-gpu-layers is not given: none with --cpu, all with
    --gpu, else the default (all where the build has a GPU here, `default_gpu_layers`)."""
    if getattr(args, "cpu", False):
        return 0
    if getattr(args, "gpu", False):
        if not native.gpu_offload_supported():
            logging.getLogger(__name__).warning(
                "--gpu: this llama-cpp-python has no GPU offload here: the layers stay on the CPU "
                "(build it for your GPU: README, \"Hardware\")")
        return -1
    return default_gpu_layers()


def hardware_from(args: argparse.Namespace) -> Hardware:
    default = gpu_layers_from(args)

    def layers(value: int | None) -> int:
        return value if value is not None else default

    return Hardware(n_threads=args.threads, n_ctx=args.ctx,
                    draft_gpu_layers=layers(args.draft_gpu_layers),
                    target_gpu_layers=layers(args.target_gpu_layers), flash_attn=args.flash_attn,
                    target_rpc=parse_endpoints(args.target_rpc) if args.target_rpc else ())


def engine_kwargs(args: argparse.Namespace, *, method: str | None = None) -> dict[str, Any]:
    """The Engine's keywords the flags give (decoding flags are optional: `bench` has fewer)."""
    return dict(
        method=method or getattr(args, "method", DEFAULT_METHOD), hardware=hardware_from(args),
        verifier=getattr(args, "verifier", "auto"),
        threshold=getattr(args, "threshold", None), preset=getattr(args, "preset", None),
        max_fp_rate=getattr(args, "max_fp_rate", None),
        prompt_cache_mib=getattr(args, "cache_ram", 0),
        reply_memory_tokens=getattr(args, "reply_memory", 0),
        **method_settings_from(args),
    )


def pairing_from(args: argparse.Namespace, method: str | None = None) -> Pairing:
    """--target and --draft resolved (a path or a found model's name; no --draft: the draft found
    here for the target), kept in `args.pairing` for what reports it (`generate --stats`). With
    no draft found where the method would use one, one line says so and how to get one."""
    if getattr(args, "pairing", None) is None:
        args.pairing = pair(args.target, args.draft, dirs=getattr(args, "models_dir", ()))
        strategy = get_strategy(method or getattr(args, "method", DEFAULT_METHOD))
        if args.pairing.draft is None and args.draft is None and strategy.uses_draft:
            without = ", ".join(m for m in methods() if not get_strategy(m).needs_draft)
            print(f"sprinter-edge: no draft for {args.pairing.target.name}: no smaller model found here "
                  f"shares its tokenizer, so the methods that need none run ({without}); `sprinter-edge "
                  "pull` gets a pair with a draft (`sprinter-edge models` lists them), or name one with "
                  "--draft", file=sys.stderr)
    return args.pairing


def engine_from(args: argparse.Namespace, *, method: str | None = None, with_draft: bool = False) -> Engine:
    """The engine the flags describe (decoding flags are optional: `bench` has fewer).
    `with_draft`: fetch the pair's draft even when the method would not use it."""
    kwargs = engine_kwargs(args, method=method)
    if args.target:
        pairing = pairing_from(args, method)
        draft = pairing.draft.path if pairing.draft else None
        return Engine.from_files(pairing.target.path, draft=draft, **kwargs)
    if args.draft:
        raise SettingsError("--draft needs --target as well")
    return Engine.from_pair(args.pair, offline=args.offline, download=not args.offline,
                            progress=sys.stderr.isatty(), with_draft=with_draft, **kwargs)


def setup_logging(verbose: int) -> None:
    level = logging.WARNING if verbose == 0 else logging.INFO if verbose == 1 else logging.DEBUG
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
    # llama.cpp's own chatter only with -vv
    logging.getLogger("sprinter_edge.llama_cpp").setLevel(
        logging.DEBUG if verbose >= 2 else logging.ERROR)
