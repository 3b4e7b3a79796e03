"""Which llama.cpp build suits this machine, and whether the installed one does.

Stdlib only, so that tools/setup.sh can run it as a plain script before the package or
llama-cpp-python is installed:

    python3 sprinter_edge/backend/buildflags.py --cmake-args   # the CMAKE_ARGS to build with
    python3 sprinter_edge/backend/buildflags.py --why          # one line: what was chosen and why
    python3 sprinter_edge/backend/buildflags.py --wheel-key "$CMAKE_ARGS"
    python3 sprinter_edge/backend/buildflags.py --cmake-args --user="$CMAKE_ARGS"   # yours added
    python3 sprinter_edge/backend/buildflags.py --replaced --user="$CMAKE_ARGS"     # what yours replaced

A user's CMAKE_ARGS are added to the chosen ones, not put in their place (`merge_cmake_args`):
the RPC client and the CPU's instruction sets stay, and for an option both set, the user's value
is the one kept (it comes last, and a later -D wins in cmake too).

x86-64 choice, "native minus AMX": GGML_NATIVE=OFF plus an explicit ON/OFF for every
instruction-set option, ON exactly where /proc/cpuinfo lists the instructions. A -march=native
build would also pick up AMX on recent Intel Xeons, and such a build segfaults on the first
decode there (in ggml_backend_amx_mul_mat), so AMX is always OFF; every other instruction set
the CPU has stays on. Options are spelled out both ways because their defaults move: with
GGML_NATIVE=OFF, llama.cpp turns SSE4.2/AVX/AVX2/BMI2/FMA/F16C ON unless SOURCE_DATE_EPOCH is
set, which would crash a CPU without AVX2 and silently drop them from a reproducible build.
"""

from __future__ import annotations

import argparse
import hashlib
import platform
import re
import shlex
import shutil
import sys
from dataclasses import dataclass, field

LLAMA_CPP_PYTHON_VERSION = "0.3.36"

# Linux spells a few flags without the underscore; normalise to one name.
_FLAG_ALIASES = {"avx512vbmi": "avx512_vbmi", "avxvnni": "avx_vnni"}

# GGML_AVX512 compiles with -mavx512f -mavx512cd -mavx512vl -mavx512dq -mavx512bw
# (ggml/src/ggml-cpu/CMakeLists.txt), so it needs all five, not only avx512f.
_AVX512_BASE = ("avx512f", "avx512cd", "avx512vl", "avx512dq", "avx512bw")

# (CMake option, /proc/cpuinfo flags it needs, name in llama_print_system_info or None)
X86_OPTIONS: tuple[tuple[str, tuple[str, ...], str | None], ...] = (
    ("GGML_SSE42", ("sse4_2",), None),
    ("GGML_AVX", ("avx",), "AVX"),
    ("GGML_AVX2", ("avx2",), "AVX2"),
    ("GGML_FMA", ("fma",), "FMA"),
    ("GGML_F16C", ("f16c",), "F16C"),
    ("GGML_BMI2", ("bmi2",), "BMI2"),
    ("GGML_AVX_VNNI", ("avx_vnni",), "AVX_VNNI"),
    ("GGML_AVX512", _AVX512_BASE, "AVX512"),
    ("GGML_AVX512_VBMI", (*_AVX512_BASE, "avx512_vbmi"), "AVX512_VBMI"),
    ("GGML_AVX512_VNNI", (*_AVX512_BASE, "avx512_vnni"), "AVX512_VNNI"),
    ("GGML_AVX512_BF16", (*_AVX512_BASE, "avx512_bf16"), "AVX512_BF16"),
)
AMX_OFF = ("-DGGML_AMX_TILE=OFF", "-DGGML_AMX_INT8=OFF", "-DGGML_AMX_BF16=OFF")
# llama.cpp's RPC client in every build: --target-rpc puts the target's layers on rpc-servers
# (the backend only registers; it opens no port and costs nothing until used)
RPC_ON = "-DGGML_RPC=ON"

# Instruction sets llama_print_system_info reports (CPU backend, x86), in its order, -> the
# cpuinfo flags they need. AMX_INT8 is left out on purpose: the recommended build never uses it.
_BY_INFO_NAME = {name: flags for _, flags, name in X86_OPTIONS if name is not None}
X86_INFO_FEATURES: dict[str, tuple[str, ...]] = {
    "SSE3": ("pni",),
    "SSSE3": ("ssse3",),
    **{name: _BY_INFO_NAME[name] for name in ("AVX", "AVX_VNNI", "AVX2", "F16C", "FMA", "BMI2", "AVX512",
                                               "AVX512_VBMI", "AVX512_VNNI", "AVX512_BF16")},
}


@dataclass(frozen=True)
class Choice:
    cmake_args: str
    reason: str


@dataclass(frozen=True)
class BuildCheck:
    """The installed build's instruction sets against the CPU's."""

    build: frozenset[str]  # instruction sets the build uses (system_info names)
    cpu: frozenset[str]  # instruction sets the CPU offers, among those llama.cpp can use
    missing: tuple[str, ...]  # the CPU has them, the build does not: a rebuild is faster
    unsupported: tuple[str, ...]  # the build uses them, the CPU lacks them: it will crash
    recommended: str  # CMAKE_ARGS for this machine
    commands: tuple[str, ...] = field(default=())  # how to rebuild, empty when not needed


def read_cpu_flags(path: str = "/proc/cpuinfo") -> frozenset[str]:
    """The x86 feature flags of the first CPU in /proc/cpuinfo (empty when unreadable)."""
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            for line in fh:
                key, _, value = line.partition(":")
                if key.strip() == "flags":
                    return normalise_flags(value.split())
    except OSError:
        pass
    return frozenset()


def normalise_flags(flags) -> frozenset[str]:
    return frozenset(_FLAG_ALIASES.get(f.lower(), f.lower()) for f in flags)


def x86_options(flags) -> dict[str, bool]:
    """Every x86 instruction-set option of ggml: ON where the CPU has what it needs."""
    flags = normalise_flags(flags)
    return {option: all(f in flags for f in needs) for option, needs, _ in X86_OPTIONS}


def x86_cmake_args(flags) -> str:
    options = x86_options(flags)
    parts = ["-DGGML_NATIVE=OFF"]
    parts += [f"-D{option}={'ON' if on else 'OFF'}" for option, on in options.items()]
    parts += AMX_OFF
    return " ".join(parts)


def recommend(system: str | None = None, machine: str | None = None, flags=None,
              nvidia: bool | None = None) -> Choice:
    """The CMAKE_ARGS for this machine (arguments override detection, for tests)."""
    system = system or platform.system()
    machine = (machine or platform.machine()).lower()
    if nvidia is None:
        nvidia = shutil.which("nvidia-smi") is not None
    if system == "Darwin":
        return Choice(f"-DGGML_METAL=on {RPC_ON}", "macOS: Metal GPU backend")
    x86 = machine in ("x86_64", "amd64", "i686", "i386")
    if x86 and flags is None:
        flags = read_cpu_flags()
    cpu = x86_cmake_args(flags) if x86 and flags else ""
    if x86 and flags:
        on = [option.removeprefix("GGML_") for option, ok in x86_options(flags).items() if ok]
        isa = " ".join(on) or "none beyond x86-64"
        why = f"x86-64 CPU, instruction sets it has: {isa}; AMX off (crashes llama.cpp)"
    elif x86:
        why = "x86-64 CPU, flags unreadable: llama.cpp's portable defaults"
        cpu = "-DGGML_NATIVE=OFF " + " ".join(AMX_OFF)
    else:
        why = f"{machine} CPU: llama.cpp's own native build"
    if nvidia:
        return Choice(f"-DGGML_CUDA=on {cpu} {RPC_ON}".replace("  ", " "), f"nvidia-smi found: CUDA; {why}")
    return Choice(f"{cpu} {RPC_ON}".strip(), why)


@dataclass(frozen=True)
class Merged:
    """The chosen CMAKE_ARGS with a user's added (`merge_cmake_args`)."""

    cmake_args: str
    replaced: tuple[tuple[str, str, str | None], ...]  # (option, chosen value, user's; None: -U)

    def describe_replaced(self) -> str:
        """One line: the chosen settings the user's replaced ("" when none)."""
        return ", ".join(f"-D{key}={chosen} (yours: {f'-D{key}={mine}' if mine is not None else f'-U{key}'})"
                         for key, chosen, mine in self.replaced)


def cmake_settings(args: str) -> list[tuple[int, int, str, str | None]]:
    """Each -D/-U in a CMAKE_ARGS string: (first token, token count, option, value; None for -U).

    Spellings: -DNAME=VALUE, -DNAME:TYPE=VALUE, -D NAME=VALUE, -UNAME, -U NAME. Raises
    ValueError on unbalanced quotes (the string is split as a shell would)."""
    tokens = shlex.split(args)
    out: list[tuple[int, int, str, str | None]] = []
    i = 0
    while i < len(tokens):
        token = tokens[i]
        if token in ("-D", "-U") and i + 1 < len(tokens):
            body, n = tokens[i + 1], 2
        elif token.startswith(("-D", "-U")) and len(token) > 2:
            body, n = token[2:], 1
        else:
            i += 1
            continue
        if token.startswith("-D"):
            name, eq, value = body.partition("=")
            if eq and name:
                out.append((i, n, name.split(":", 1)[0], value))
        else:
            out.append((i, n, body, None))
        i += n
    return out


def cmake_option(args: str, option: str) -> str | None:
    """The value the last -D of `option` in `args` sets (None: never set, or -U last)."""
    value = None
    for _, _, key, v in cmake_settings(args):
        if key == option:
            value = v
    return value


def cmake_on(value: str | None) -> bool:
    """CMake's truth for an option's value (an option never set is off, as GGML_RPC's default)."""
    if value is None:
        return False
    value = value.strip().upper()
    if value in ("ON", "YES", "TRUE", "Y"):
        return True
    try:
        return float(value) != 0
    except ValueError:
        return False


def has_rpc(cmake_args: str) -> bool:
    """Whether a build with these CMAKE_ARGS has llama.cpp's RPC backend (and its rpc-server)."""
    return cmake_on(cmake_option(cmake_args, "GGML_RPC"))


def merge_cmake_args(chosen: str, user: str) -> Merged:
    """The chosen CMAKE_ARGS with a user's added: every chosen setting the user's leave alone
    is kept, then the user's string, verbatim (their quoting too). A chosen -D of an option
    the user's set or unset is dropped, and listed in `replaced` when the values differ.
    Merging the result again with the same chosen args changes nothing."""
    user = user.strip()
    tokens = chosen.split()  # buildflags' own: plain -DNAME=VALUE, no quoting
    if not user:
        return Merged(" ".join(tokens), ())
    mine: dict[str, str | None] = {key: value for _, _, key, value in cmake_settings(user)}
    drop: set[int] = set()
    replaced = []
    for i, n, key, value in cmake_settings(chosen):
        if key not in mine:
            continue
        drop.update(range(i, i + n))
        theirs = mine[key]
        if value is not None and (theirs is None or theirs.strip().upper() != value.upper()):
            replaced.append((key, value, theirs))
    kept = [t for j, t in enumerate(tokens) if j not in drop]
    return Merged(" ".join([*kept, user]), tuple(replaced))


def wheel_key(cmake_args: str, version: str = LLAMA_CPP_PYTHON_VERSION) -> str:
    """Short hash naming the wheel-cache folder of one (version, CMAKE_ARGS) build."""
    text = f"llama-cpp-python=={version}\n{' '.join(cmake_args.split())}"
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def parse_system_info(info: str) -> dict[str, dict[str, str]]:
    """llama_print_system_info() -> {backend: {feature: value}}.

    Format: "CPU : SSE3 = 1 | AVX = 1 | ... | REPACK = 1 | " with one "NAME : " prefix per
    backend (e.g. "CUDA : ARCHS = 890 | ... | CPU : ..."); older builds had no prefix and
    listed absent features as "= 0"."""
    out: dict[str, dict[str, str]] = {}
    backend = "CPU"
    for chunk in info.split("|"):
        chunk = chunk.strip()
        m = re.fullmatch(r"(?:(.+?)\s+:\s+)?([A-Za-z0-9_]+)\s*=\s*(.*)", chunk)
        if not m:
            continue
        if m.group(1):
            backend = m.group(1).strip()
        out.setdefault(backend, {})[m.group(2)] = m.group(3).strip()
    return out


def build_features(info: str) -> frozenset[str]:
    """The CPU backend features the build uses (value not 0), e.g. {"AVX2", "FMA", "REPACK"}."""
    cpu = parse_system_info(info).get("CPU", {})
    return frozenset(name for name, value in cpu.items() if value not in ("0", ""))


def cpu_features(flags) -> frozenset[str]:
    """The instruction sets (system_info names) this CPU offers that llama.cpp can use."""
    flags = normalise_flags(flags)
    return frozenset(name for name, needs in X86_INFO_FEATURES.items() if all(f in flags for f in needs))


def ordered(features) -> list[str]:
    """Instruction-set names in llama.cpp's order (SSE3 ... AVX512_BF16)."""
    order = list(X86_INFO_FEATURES)
    return sorted(features, key=lambda f: (order.index(f) if f in order else len(order), f))


def rebuild_commands(cmake_args: str) -> tuple[str, str]:
    """(from a checkout, for pip users)."""
    pip = (f'CMAKE_ARGS="{cmake_args}" pip install --force-reinstall --no-deps --no-cache-dir '
           f"llama-cpp-python=={LLAMA_CPP_PYTHON_VERSION}")
    return "tools/setup.sh --rebuild", pip


def check_build(info: str, flags=None, choice: Choice | None = None) -> BuildCheck:
    """Compare the installed build (its system_info string) with this CPU.

    Only x86 instruction sets are compared; elsewhere both sets are empty."""
    if flags is None:
        flags = read_cpu_flags()
    choice = choice or recommend(flags=flags)
    build = build_features(info) & set(X86_INFO_FEATURES)
    cpu = cpu_features(flags)
    missing = tuple(ordered(cpu - build))
    unsupported = tuple(ordered(build - cpu)) if cpu else ()
    commands = rebuild_commands(choice.cmake_args) if missing or unsupported else ()
    return BuildCheck(build=build, cpu=cpu, missing=missing, unsupported=unsupported,
                      recommended=choice.cmake_args, commands=commands)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="CMAKE_ARGS for the fastest safe llama.cpp build here.")
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--cmake-args", action="store_true", help="print the CMAKE_ARGS for this machine")
    g.add_argument("--why", action="store_true", help="print what was chosen and why")
    g.add_argument("--wheel-key", metavar="CMAKE_ARGS",
                   help="print the wheel-cache key of llama-cpp-python built with these CMAKE_ARGS")
    g.add_argument("--replaced", action="store_true",
                   help="print the chosen settings that --user's replaced (nothing when none)")
    p.add_argument("--user", metavar="CMAKE_ARGS", default="",
                   help="a user's CMAKE_ARGS, added to the chosen ones (write --user=\"$CMAKE_ARGS\")")
    args = p.parse_args(argv)
    if args.wheel_key is not None:
        print(wheel_key(args.wheel_key))
        return 0
    if args.why:
        print(recommend().reason)
        return 0
    try:
        merged = merge_cmake_args(recommend().cmake_args, args.user)
    except ValueError as exc:  # unbalanced quotes
        print(f"buildflags: error: CMAKE_ARGS={args.user!r}: {exc}", file=sys.stderr)
        return 2
    print(merged.describe_replaced() if args.replaced else merged.cmake_args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
