"""llama.cpp's own tools (llama-server, llama-bench, llama-batched-bench), built from the
llama.cpp sources vendored in the installed llama-cpp-python's sdist with the CMAKE_ARGS of
the installed wheel, and cached per (version, CMAKE_ARGS) like tools/setup.sh caches the wheel.

Stdlib only, so that it runs as a plain script (tools/build_llama_server.sh calls it):

    python3 sprinter_edge/backend/llama_tools.py build [--rebuild] [--jobs N]
    python3 sprinter_edge/backend/llama_tools.py where     # the bin folder; exit 1 when not built

The binaries live in ${SPRINTER_EDGE_TOOLS:-~/.cache/sprinter-edge/llama-tools}/<key>/bin/
(ggml-rpc-server only where the CMAKE_ARGS turn GGML_RPC on: llama.cpp defines that target only
then; llama-server.exe and so on on Windows), the key `buildflags.wheel_key(CMAKE_ARGS, version)`:
the same key as the wheel built with those flags. The bench only looks the binaries up
(`find_tool`), it never builds: a compile during a timing run would take both cores for minutes.

Which CMAKE_ARGS: $CMAKE_ARGS when set, as they are (tools/build_llama_server.sh first adds a
user's to the chosen ones, as tools/setup.sh does), else the ones recorded next to the
installed wheel (setup.sh writes build.txt beside it; pip records the wheel's path), else what
buildflags.py recommends for this machine.

How: when tools/setup.sh kept the wheel's CMake build tree (<wheels>/<key>/build), the tools are
built in that tree, so llama.cpp is compiled once for the wheel and the tools alike (ggml, llama,
common: about 5 of the 6-7 minutes); the binaries are copied to the cache with the shared
libraries they link (lib*.so* on Linux, lib*.dylib on macOS), found through a run path of the
binaries' own folder ($ORIGIN on Linux, @loader_path on macOS). Without such a tree: a standalone
build of the vendored sources (a Release build, no curl, no OpenSSL, no tests, static libraries).
"""

from __future__ import annotations

import argparse
import importlib.metadata as md
import json
import logging
import os
import platform
import shlex
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlparse

if __package__:
    from . import buildflags
else:  # run as a script
    import buildflags  # type: ignore[no-redef]

log = logging.getLogger(__name__)

# ggml-rpc-server: the other end of --target-rpc, for the RPC bench and its tests; llama.cpp
# defines its target only in a build with GGML_RPC on (`tools_for`)
RPC_SERVER = "ggml-rpc-server"
TOOLS = ("llama-server", "llama-bench", "llama-batched-bench", RPC_SERVER)
EXTRA_CMAKE_ARGS = ("-DCMAKE_BUILD_TYPE=Release", "-DLLAMA_CURL=OFF", "-DLLAMA_OPENSSL=OFF",
                    "-DLLAMA_BUILD_TESTS=OFF", "-DBUILD_SHARED_LIBS=OFF")
# Turned on in the wheel's build tree: llama.cpp's tools/ (which then adds mtmd itself, so the
# wrapper's own mtmd is switched off), no tests or examples, and a run path that finds the
# shared libraries copied beside the binaries (`tree_cmake_args`: the run path is the platform's).
TREE_CMAKE_ARGS = ("-DLLAMA_BUILD_TOOLS=ON", "-DLLAMA_BUILD_SERVER=ON", "-DLLAVA_BUILD=OFF",
                   "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF", "-DCMAKE_BUILD_RPATH=$ORIGIN")
BUILD_HINT = "run tools/build_llama_server.sh"
SERVER_ENV = "SPRINTER_EDGE_LLAMA_SERVER"  # an explicit llama-server binary, overrides the cache


def tree_cmake_args(system: str | None = None) -> tuple[str, ...]:
    """TREE_CMAKE_ARGS for this system: the binaries find the libraries beside them through
    $ORIGIN on Linux, @loader_path on macOS (Windows looks beside an .exe by itself)."""
    system = system or platform.system()
    if system == "Darwin":
        return tuple(a.replace("$ORIGIN", "@loader_path") for a in TREE_CMAKE_ARGS)
    return TREE_CMAKE_ARGS


def shared_library_globs(system: str | None = None) -> tuple[str, ...]:
    """The shared libraries of a build tree's bin/ that its tools link."""
    system = system or platform.system()
    if system == "Darwin":
        return ("lib*.dylib",)
    if system == "Windows":
        return ("*.dll",)
    return ("lib*.so*",)


def exe_name(tool: str, system: str | None = None) -> str:
    """A tool's file name: llama-server.exe on Windows."""
    return f"{tool}.exe" if (system or platform.system()) == "Windows" else tool


def tools_for(cmake_args: str) -> tuple[str, ...]:
    """The tools a build with these CMAKE_ARGS makes: ggml-rpc-server only with GGML_RPC on."""
    return TOOLS if buildflags.has_rpc(cmake_args) else tuple(t for t in TOOLS if t != RPC_SERVER)


def cmake_hint(system: str | None = None) -> str:
    """How to get cmake here, one phrase."""
    system = system or platform.system()
    if system == "Darwin":
        return "pip install cmake (PyPI's, into this venv) or brew install cmake"
    if system == "Linux":
        return "pip install cmake (PyPI's, into this venv), or apt-get install cmake / dnf install cmake"
    return "pip install cmake (PyPI's, into this venv)"


def find_cmake() -> str | None:
    """cmake on PATH, else the one PyPI's `cmake` package put beside this Python (a venv's)."""
    return shutil.which("cmake") or shutil.which("cmake", path=str(Path(sys.executable).parent))


class ToolsError(RuntimeError):
    """A build step failed, or an explicit binary is unusable."""


@dataclass(frozen=True)
class BuildSpec:
    version: str  # llama-cpp-python's version (its sdist vendors the llama.cpp sources)
    cmake_args: str  # the wheel's CMAKE_ARGS
    source: str  # where cmake_args came from, one phrase

    @property
    def key(self) -> str:
        return buildflags.wheel_key(self.cmake_args, self.version)

    @property
    def folder(self) -> Path:
        return tools_root() / self.key

    @property
    def bin(self) -> Path:
        return self.folder / "bin"

    @property
    def tools(self) -> tuple[str, ...]:
        """The tools this build makes (ggml-rpc-server only with GGML_RPC on)."""
        return tools_for(self.cmake_args)


def tools_root() -> Path:
    root = os.environ.get("SPRINTER_EDGE_TOOLS")
    return Path(root).expanduser() if root else Path.home() / ".cache" / "sprinter-edge" / "llama-tools"


def installed_version() -> str:
    """The installed llama-cpp-python's version (buildflags' pin when it is not installed)."""
    try:
        return md.version("llama-cpp-python")
    except md.PackageNotFoundError:
        return buildflags.LLAMA_CPP_PYTHON_VERSION


def _wheel_build_txt() -> Path | None:
    """build.txt beside the wheel the installed llama-cpp-python came from (setup.sh's cache)."""
    try:
        dist = md.distribution("llama-cpp-python")
    except md.PackageNotFoundError:
        return None
    try:
        url = json.loads(dist.read_text("direct_url.json") or "{}").get("url", "")
    except ValueError:
        return None
    if not url.startswith("file:"):
        return None
    path = Path(unquote(urlparse(url).path))
    txt = path.parent / "build.txt"
    return txt if path.suffix == ".whl" and txt.is_file() else None


def _read_cmake_args(txt: Path) -> str | None:
    for line in txt.read_text(encoding="utf-8").splitlines():
        if line.startswith("CMAKE_ARGS="):
            return line.removeprefix("CMAKE_ARGS=")
    return None


def build_spec() -> BuildSpec:
    """The version and CMAKE_ARGS to build (or look up) the tools with."""
    version = installed_version()
    env = os.environ.get("CMAKE_ARGS")
    if env:
        return BuildSpec(version, env, "CMAKE_ARGS in the environment")
    txt = _wheel_build_txt()
    args = _read_cmake_args(txt) if txt else None
    if txt and args is not None:
        return BuildSpec(version, args, f"the installed wheel's {txt}")
    return BuildSpec(version, buildflags.recommend().cmake_args,
                     "recommended for this machine (buildflags.py)")


def wheel_build_tree(spec: BuildSpec) -> tuple[Path, Path] | None:
    """The CMake build tree tools/setup.sh kept beside the wheel for `spec` and its source
    folder, when both are still there; None otherwise."""
    root = os.environ.get("SPRINTER_EDGE_WHEELS")
    wheels = Path(root).expanduser() if root else Path.home() / ".cache" / "sprinter-edge" / "wheels"
    tree = wheels / spec.key / "build"
    cache = tree / "CMakeCache.txt"
    if not cache.is_file():
        return None
    for line in cache.read_text(encoding="utf-8", errors="replace").splitlines():
        if line.startswith("CMAKE_HOME_DIRECTORY:"):
            src = Path(line.split("=", 1)[1])
            return (tree, src) if (src / "vendor" / "llama.cpp" / "CMakeLists.txt").is_file() else None
    return None


def where(spec: BuildSpec | None = None) -> Path | None:
    """The bin folder when every tool of this spec is built, else None."""
    spec = spec or build_spec()
    ok = all(os.access(spec.bin / exe_name(t), os.X_OK) for t in spec.tools)
    return spec.bin if ok else None


def find_tool(name: str = "llama-server") -> Path | None:
    """The binary the bench runs: $SPRINTER_EDGE_LLAMA_SERVER for llama-server when set, else
    the cached build for the installed llama-cpp-python and its CMAKE_ARGS; None when not built."""
    explicit = os.environ.get(SERVER_ENV) if name == "llama-server" else None
    if explicit:
        path = Path(explicit).expanduser()
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise ToolsError(f"{SERVER_ENV}={explicit} is not an executable file")
        return path
    folder = where()
    if folder is None:
        return None
    path = folder / exe_name(name)
    return path if os.access(path, os.X_OK) else None  # e.g. ggml-rpc-server of a build without RPC


def _run(cmd: list[str]) -> None:
    log.info("$ %s", " ".join(shlex.quote(c) for c in cmd))
    rc = subprocess.call(cmd)
    if rc != 0:
        raise ToolsError(f"`{cmd[0]} {cmd[1] if len(cmd) > 1 else ''}` failed with exit status {rc}")


def build(*, rebuild: bool = False, jobs: int | None = None, spec: BuildSpec | None = None) -> Path:
    """Build the tools for `spec` (default: `build_spec()`) unless they are cached; the bin folder."""
    spec = spec or build_spec()
    log.info("llama-cpp-python %s, CMAKE_ARGS=%r (%s)", spec.version, spec.cmake_args, spec.source)
    cached = where(spec)
    if cached and not rebuild:
        log.info("cached: %s (key %s); --rebuild compiles again", cached, spec.key)
        return cached
    cmake = find_cmake()
    if cmake is None:
        raise ToolsError(f"cmake not found: install it ({cmake_hint()}) and run again")
    root = tools_root()
    root.mkdir(parents=True, exist_ok=True)
    jobs = jobs or os.cpu_count() or 1
    t0 = time.monotonic()
    tmp = Path(tempfile.mkdtemp(prefix=".build-", dir=root))
    try:
        out = tmp / "out"
        (out / "bin").mkdir(parents=True)
        kept = wheel_build_tree(spec)
        if kept is not None:
            how = f"in the wheel's build tree {kept[0]}"
            _build_in_tree(*kept, jobs, out / "bin", tools=spec.tools, cmake=cmake)
        else:
            how = "standalone (no kept wheel build tree)"
            _build_standalone(spec, tmp, jobs, out / "bin", cmake=cmake)
        seconds = time.monotonic() - t0
        (out / "build.txt").write_text(
            f"llama-cpp-python=={spec.version}\nCMAKE_ARGS={spec.cmake_args}\n"
            f"CMAKE_ARGS source: {spec.source}\nhow: {how}\n"
            f"built: {time.strftime('%Y-%m-%d %H:%M:%S %z')} in {seconds:.0f} s with -j {jobs}\n",
            encoding="utf-8")
        if spec.folder.exists():
            shutil.rmtree(spec.folder)
        out.rename(spec.folder)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    log.info("built %s in %.0f s: %s", ", ".join(spec.tools), time.monotonic() - t0, spec.bin)
    return spec.bin


def _build_in_tree(tree: Path, src: Path, jobs: int, bin_out: Path, *, tools: tuple[str, ...] = TOOLS,
                   cmake: str = "cmake") -> None:
    """Add the tools to the wheel's build tree and build only them; copy them and the shared
    libraries they link to `bin_out`."""
    _run([cmake, "-S", str(src), "-B", str(tree), *tree_cmake_args()])
    _run([cmake, "--build", str(tree), "-j", str(jobs), "--target", *tools])
    built = tree / "bin"
    for t in tools:
        exe = built / exe_name(t)
        if not exe.is_file():
            raise ToolsError(f"the build made no {exe}")
        shutil.copy2(exe, bin_out / exe.name)
    for pattern in shared_library_globs():
        for lib in built.glob(pattern):
            shutil.copy2(lib, bin_out / lib.name, follow_symlinks=True)


def _build_standalone(spec: BuildSpec, tmp: Path, jobs: int, bin_out: Path, *, cmake: str = "cmake") -> None:
    """Download the sdist and build the tools from its vendored llama.cpp, statically."""
    _run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
          "--progress-bar", "off", "--dest", str(tmp), f"llama-cpp-python=={spec.version}"])
    sdists = sorted(tmp.glob("llama_cpp_python-*.tar.gz"))
    if not sdists:
        raise ToolsError(f"pip download left no llama_cpp_python-*.tar.gz in {tmp}")
    with tarfile.open(sdists[0]) as tar:
        if hasattr(tarfile, "data_filter"):
            tar.extractall(tmp, filter="data")
        else:  # pragma: no cover - Python < 3.11.4
            tar.extractall(tmp)  # noqa: S202 - the sdist pip just checked
    src = next(tmp.glob("llama_cpp_python-*/vendor/llama.cpp"), None)
    if src is None or not (src / "CMakeLists.txt").is_file():
        raise ToolsError(f"no vendored llama.cpp in {sdists[0].name}")
    build_dir = tmp / "build"
    ninja = shutil.which("ninja") or shutil.which("ninja", path=str(Path(sys.executable).parent))
    gen = ["-G", "Ninja", f"-DCMAKE_MAKE_PROGRAM={ninja}"] if ninja else []
    _run([cmake, "-S", str(src), "-B", str(build_dir), *gen, *EXTRA_CMAKE_ARGS,
          *shlex.split(spec.cmake_args)])
    _run([cmake, "--build", str(build_dir), "-j", str(jobs), "--target", *spec.tools])
    for t in spec.tools:
        exe = build_dir / "bin" / exe_name(t)
        if not exe.is_file():
            raise ToolsError(f"the build made no {exe}")
        shutil.copy2(exe, bin_out / exe.name)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="build_llama_server",
        description="Build llama.cpp's llama-server, llama-bench and llama-batched-bench from the "
                    "sources vendored in the installed llama-cpp-python's sdist, with the wheel's "
                    "CMAKE_ARGS; cached per (version, CMAKE_ARGS) under "
                    "${SPRINTER_EDGE_TOOLS:-~/.cache/sprinter-edge/llama-tools}/<key>/bin.")
    sub = p.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="build unless cached (about 7 minutes on 2 cores)")
    b.add_argument("--rebuild", action="store_true", help="compile again even when cached")
    b.add_argument("--jobs", type=int, default=None, help="parallel compile jobs (default: all cores)")
    sub.add_parser("where", help="print the bin folder of the cached build (exit 1 when not built)")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="build_llama_server: %(message)s", stream=sys.stderr)
    spec = build_spec()
    if args.cmd == "where":
        folder = where(spec)
        if folder is None:
            print(f"not built for llama-cpp-python {spec.version} and CMAKE_ARGS={spec.cmake_args!r}: "
                  f"{BUILD_HINT}", file=sys.stderr)
            return 1
        print(folder)
        return 0
    if args.jobs is not None and args.jobs < 1:
        p.error("--jobs must be >= 1")
    try:
        build(rebuild=args.rebuild, jobs=args.jobs, spec=spec)
    except (ToolsError, OSError, tarfile.TarError) as exc:
        print(f"build_llama_server: error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
