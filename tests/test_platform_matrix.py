"""The platform matrix, by simulation (tests/support/platforms.py says what is simulated and
what cannot be): on darwin-arm64, darwin-x86_64, linux-aarch64, linux-x86_64 and win32-amd64,
each in a subprocess of its own, every module of the package imports, the CLI's `--help` and
every subcommand's, and `doctor --no-timing`, run; the build flags setup would choose, the RPC
keepalive, the REPL's paste, peak memory, the HumanEval sandbox and process liveness are each
what that platform needs. The GPU, threads and context defaults per platform are
tests/test_platform_defaults.py's."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest
from support.platforms import PLATFORMS, run, run_all

DEAD_PID = 4194305  # above Linux's largest pid_max (2**22): never a live process here

CHECK = r'''
import argparse, contextlib, io, json, os, platform, sys, tempfile, time, traceback
from pathlib import Path

out = {"import_failed": IMPORT_FAILED, "real_modules": len(REAL_MODULES), "real_failed": REAL_FAILED,
       "errors": {}, "seconds": {}}


def guarded(key):
    def wrap(fn):
        t0 = time.perf_counter()
        try:
            out[key] = fn()
        except BaseException:  # every check reports, the first failure does not hide the others
            out["errors"][key] = traceback.format_exc()[-2000:]
        out["seconds"][key] = round(time.perf_counter() - t0, 2)
        return fn
    return wrap


@guarded("simulated")
def _():
    try:
        open("/proc/self/status").close()
        proc = True
    except OSError:
        proc = False
    return {"sys.platform": sys.platform, "system": platform.system(), "machine": platform.machine(),
            "cpus": os.cpu_count(), "proc": proc}


from sprinter_edge.cli import build_parser, main


def cli(*argv):
    buf, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(err):
        try:
            code = main(list(argv))
        except SystemExit as exc:
            code = exc.code
        except BaseException:
            code = traceback.format_exc()[-2000:]
    return code, buf.getvalue(), err.getvalue()


def commands(parser, path=()):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            seen = set()
            for name, sub in action.choices.items():
                if id(sub) not in seen:
                    seen.add(id(sub))
                    yield (*path, name)
                    yield from commands(sub, (*path, name))


@guarded("helps")
def _():
    helps = {}
    for path in [(), *commands(build_parser())]:
        code, text, err = cli(*path, "--help")
        helps[" ".join(path) or "-"] = {"code": code, "usage": text.startswith("usage:"),
                                        "stderr": err[-500:]}
    return helps


@guarded("doctor")
def _():
    home = Path(tempfile.mkdtemp(prefix="sprinter-edge-platform-"))
    os.environ["SPRINTER_EDGE_HOME"] = str(home)
    (home / "models").mkdir()
    (home / "models" / f"gone.gguf.{DEAD_PID}.partial").write_bytes(b"x")
    mine = home / "models" / f"mine.gguf.{os.getpid()}.partial"
    mine.write_bytes(b"x")
    code, text, err = cli("doctor", "--no-timing")
    return {"code": code, "text": text, "stderr": err[-2000:], "kept_own_partial": mine.exists(),
            "removed_dead_partial": not (home / "models" / f"gone.gguf.{DEAD_PID}.partial").exists()}


@guarded("buildflags")
def _():
    from sprinter_edge.backend import buildflags, native

    choice = buildflags.recommend(nvidia=False)
    check = buildflags.check_build(native.system_info(), choice=choice)
    with contextlib.redirect_stdout(io.StringIO()) as why:
        buildflags.main(["--why"])
    return {"cmake": choice.cmake_args, "reason": choice.reason, "missing": list(check.missing),
            "unsupported": list(check.unsupported), "why": why.getvalue().strip()}


@guarded("keepalive")
def _():
    import logging
    import types

    from sprinter_edge.backend import rpc

    fds = rpc._open_fds()
    with contextlib.redirect_stderr(io.StringIO()) as err:
        logging.basicConfig(level=logging.WARNING, force=True)
        set_here = rpc.Devices.keep_alive(types.SimpleNamespace(endpoints=("127.0.0.1:9",)))
    return {"options": rpc.keepalive_options(), "fds": None if fds is None else len(fds),
            "set": set_here, "log": err.getvalue()}


@guarded("paste")
def _():
    from sprinter_edge.cli import chat

    editor = chat.line_editor()
    chat._setup_readline(None)()
    bound = getattr(sys.modules.get("readline"), "bound", None)
    return {"editor": editor, "hint": chat.paste_hint(editor), "bound": bound}


@guarded("memory")
def _():
    from sprinter_edge.bench import memory

    return memory.peak_rss_mib()


@guarded("sandbox")
def _():
    from sprinter_edge.bench import quality

    ran = quality.run_program("print(1)", timeout=30)
    env = quality.sandbox_env("HOME")
    return {"limits": quality.resource is not None, "passed": ran.status, "env": env}


@guarded("liveness")
def _():
    from sprinter_edge.catalog import store

    return {"self": store.pid_alive(os.getpid()), "dead": store.pid_alive(DEAD_PID),
            "zero": store.pid_alive(0), "huge": store.pid_alive(1 << 40)}


print("RESULT " + json.dumps(out))
'''.replace("DEAD_PID", str(DEAD_PID))


def result(proc: subprocess.CompletedProcess[str]) -> dict:
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, (f"exit {proc.returncode}\n{proc.stdout[-3000:]}\n"
                                            f"{proc.stderr[-6000:]}")
    return json.loads(lines[-1].removeprefix("RESULT "))


@pytest.fixture(scope="module")
def matrix() -> dict:
    if sys.platform == "win32":
        pytest.skip("the simulation patches a POSIX interpreter (tests/support/platforms.py)")
    return run_all(CHECK)


@pytest.fixture(params=sorted(PLATFORMS))
def simulated(request: pytest.FixtureRequest, matrix: dict) -> tuple[str, dict]:
    return request.param, result(matrix[request.param])


@pytest.mark.slow
def test_the_simulation_is_in_place(simulated: tuple[str, dict]) -> None:
    name, out = simulated
    spec = PLATFORMS[name]
    assert out["simulated"] == {"sys.platform": spec.sys_platform, "system": spec.system,
                                "machine": spec.machine, "cpus": spec.cpu_count,
                                "proc": spec.proc is not None}


def test_every_module_imports(simulated: tuple[str, dict]) -> None:
    name, out = simulated
    assert out["real_failed"] == {} and out["real_modules"] > 100  # (on this machine, the dev extras)
    assert out["import_failed"] == {}, name


def test_every_help_and_doctor_run(simulated: tuple[str, dict]) -> None:
    name, out = simulated
    assert not out["errors"], "\n".join(f"--- {k}\n{v}" for k, v in out["errors"].items())
    helps = out["helps"]
    assert {"-", "generate", "chat", "serve", "bench", "models", "doctor"} <= set(helps)
    bad = {cmd: h for cmd, h in helps.items() if h["code"] != 0 or not h["usage"]}
    assert not bad, bad
    doctor = out["doctor"]
    assert doctor["code"] == 0, doctor
    assert doctor["text"].startswith("sprinter-edge doctor") and PLATFORMS[name].system in doctor["text"]
    assert "Traceback" not in doctor["stderr"], doctor["stderr"]
    # process liveness, through doctor: a dead process's partial file goes, a live one's stays
    assert doctor["removed_dead_partial"] and doctor["kept_own_partial"], doctor["text"]


def test_build_flags_suit_the_platform(simulated: tuple[str, dict]) -> None:
    name, out = simulated
    cmake = out["buildflags"]["cmake"]
    assert "-DGGML_RPC=ON" in cmake and "GGML_CUDA" not in cmake
    if name == "darwin-arm64":
        assert "-DGGML_METAL=on" in cmake
    if name in ("linux-x86_64", "win32-amd64"):  # x86 outside macOS: explicit CPU flags, AMX off
        assert "-DGGML_NATIVE=OFF" in cmake and "-DGGML_AMX_INT8=OFF" in cmake
    if name == "linux-x86_64":  # the laptop's /proc/cpuinfo: AVX2, no AVX-512
        assert "-DGGML_AVX2=ON" in cmake and "-DGGML_AVX512=OFF" in cmake
    if name == "linux-aarch64":  # llama.cpp's own native build, no x86 option
        assert "GGML_AVX" not in cmake and "GGML_NATIVE" not in cmake
    assert out["buildflags"]["why"] == out["buildflags"]["reason"]


def test_rpc_keepalive_notices_a_dead_peer_in_30_s(simulated: tuple[str, dict]) -> None:
    name, out = simulated
    options = {opt: (number, value) for opt, number, value in out["keepalive"]["options"]}
    if name.startswith("darwin"):  # macOS's names and numbers (netinet/tcp.h), not Linux's
        assert options == {"TCP_KEEPALIVE": (0x10, 10), "TCP_KEEPINTVL": (0x101, 5),
                           "TCP_KEEPCNT": (0x102, 4), "TCP_RXT_CONNDROPTIME": (0x80, 30)}
    elif name.startswith("linux"):
        assert options == {"TCP_KEEPIDLE": (4, 10), "TCP_KEEPINTVL": (5, 5), "TCP_KEEPCNT": (6, 4),
                           "TCP_USER_TIMEOUT": (18, 30_000)}
    else:  # Windows 10 1709+: keepalive, no user timeout
        assert options == {"TCP_KEEPIDLE": (3, 10), "TCP_KEEPINTVL": (17, 5), "TCP_KEEPCNT": (16, 4)}
    idle = next(v for o, (_, v) in options.items() if o in ("TCP_KEEPIDLE", "TCP_KEEPALIVE"))
    assert idle + options["TCP_KEEPINTVL"][1] * options["TCP_KEEPCNT"][1] <= 30
    if name.startswith("win32"):  # a socket is no file descriptor there: said, not crashed
        assert out["keepalive"]["fds"] is None and out["keepalive"]["set"] == 0
        assert "cannot be found on win32" in out["keepalive"]["log"]
    else:  # /proc/self/fd, or /dev/fd without /proc (macOS)
        assert out["keepalive"]["fds"] > 0


def test_the_repl_says_how_to_paste_without_gnu_readline(simulated: tuple[str, dict]) -> None:
    name, out = simulated
    paste = out["paste"]
    if name.startswith("darwin"):
        assert paste["editor"] == "libedit"
        assert not any("bracketed-paste" in b for b in paste["bound"])  # GNU's syntax: not sent to libedit
    elif name.startswith("win32"):
        assert paste["editor"] == "none"
    if paste["editor"] == "gnu":
        assert paste["hint"] is None
    else:
        assert '"""' in paste["hint"] and "\n" not in paste["hint"]


def test_peak_memory_sandbox_and_liveness(simulated: tuple[str, dict]) -> None:
    name, out = simulated
    assert math.isfinite(out["memory"]) and out["memory"] > 0
    sandbox = out["sandbox"]
    assert sandbox["passed"] == "passed"
    assert sandbox["limits"] == (not name.startswith("win32"))  # rlimits only where `resource` is
    if name.startswith("win32"):  # Python starts on Windows only with SYSTEMROOT
        assert sandbox["env"]["PATH"].startswith(sandbox["env"]["SYSTEMROOT"])
    else:
        assert sandbox["env"]["PATH"] == "/usr/bin:/bin"
    assert out["liveness"] == {"self": True, "dead": False, "zero": False, "huge": False}


BLOCKED = ("resource", "fcntl", "termios", "readline")

ON_THIS_PLATFORM = r'''
import json, math
from sprinter_edge.bench import memory
from sprinter_edge.cli import chat, main
try:
    main(["--help"])
except SystemExit as exc:
    code = exc.code
print("RESULT " + json.dumps({"import_failed": IMPORT_FAILED, "real": len(REAL_MODULES), "help": code,
                              "editor": chat.line_editor(), "peak": memory.peak_rss_mib()}))
'''


def test_every_module_imports_without_the_posix_modules() -> None:
    """On this platform, with resource, fcntl, termios and readline unimportable."""
    out = result(run(ON_THIS_PLATFORM, block=BLOCKED))
    assert out["import_failed"] == {} and out["real"] > 100
    assert out["help"] == 0 and out["editor"] == "none" and math.isfinite(out["peak"])
