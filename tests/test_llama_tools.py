"""llama.cpp's tools (tools/build_llama_server.sh, backend/llama_tools.py) on each platform, by
simulation: which tools a build makes (ggml-rpc-server only with GGML_RPC on), the run path and
shared libraries a macOS build copies (@loader_path, *.dylib), where cmake comes from, and the
merged CMAKE_ARGS the shell script hands on. Nothing is compiled: `_run` is replaced."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from sprinter_edge.backend import buildflags, llama_tools

ROOT = Path(__file__).resolve().parent.parent
NO_RPC = "-DGGML_NATIVE=OFF -DGGML_AVX2=ON"
WITH_RPC = f"{NO_RPC} -DGGML_RPC=ON"


def make_exe(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n")
    path.chmod(0o755)


def test_rpc_server_only_where_the_build_has_rpc() -> None:
    assert llama_tools.tools_for(WITH_RPC) == llama_tools.TOOLS
    assert llama_tools.RPC_SERVER in llama_tools.TOOLS
    assert llama_tools.tools_for(NO_RPC) == ("llama-server", "llama-bench", "llama-batched-bench")
    assert llama_tools.tools_for(f"{WITH_RPC} -DGGML_RPC=OFF") == llama_tools.tools_for(NO_RPC)


def test_a_build_without_rpc_is_complete_without_the_rpc_server(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.delenv(llama_tools.SERVER_ENV, raising=False)
    monkeypatch.setenv("SPRINTER_EDGE_TOOLS", str(tmp_path))
    monkeypatch.setenv("CMAKE_ARGS", NO_RPC)
    spec = llama_tools.build_spec()
    for tool in spec.tools:
        make_exe(spec.bin / tool)
    assert llama_tools.where(spec) == spec.bin
    assert llama_tools.find_tool("llama-server") == spec.bin / "llama-server"
    assert llama_tools.find_tool(llama_tools.RPC_SERVER) is None  # not built, not a missing path

    monkeypatch.setenv("CMAKE_ARGS", WITH_RPC)
    rpc_spec = llama_tools.build_spec()
    for tool in ("llama-server", "llama-bench", "llama-batched-bench"):
        make_exe(rpc_spec.bin / tool)
    assert llama_tools.where(rpc_spec) is None  # an RPC build needs its rpc-server too
    make_exe(rpc_spec.bin / llama_tools.RPC_SERVER)
    assert llama_tools.where(rpc_spec) == rpc_spec.bin


@pytest.mark.parametrize(("system", "rpath", "libs"), [
    ("Linux", "-DCMAKE_BUILD_RPATH=$ORIGIN", ("lib*.so*",)),
    ("Darwin", "-DCMAKE_BUILD_RPATH=@loader_path", ("lib*.dylib",)),
    ("Windows", "-DCMAKE_BUILD_RPATH=$ORIGIN", ("*.dll",)),  # ignored there: an .exe looks beside itself
])
def test_run_path_and_libraries_per_platform(system: str, rpath: str, libs: tuple[str, ...]) -> None:
    args = llama_tools.tree_cmake_args(system)
    assert rpath in args and sum(a.startswith("-DCMAKE_BUILD_RPATH=") for a in args) == 1
    assert llama_tools.shared_library_globs(system) == libs


@pytest.mark.parametrize("system", ["Linux", "Darwin", "Windows"])
@pytest.mark.parametrize("cmake_args", [NO_RPC, WITH_RPC])
def test_build_in_the_wheels_tree(monkeypatch, tmp_path: Path, system: str, cmake_args: str) -> None:
    """The tree build on Linux, macOS and Windows: the targets asked for, the binaries and the
    platform's shared libraries copied, with `_run` recording instead of running cmake."""
    monkeypatch.setattr(llama_tools.platform, "system", lambda: system)
    tree, src, out = tmp_path / "tree", tmp_path / "src", tmp_path / "out"
    out.mkdir()
    tools = llama_tools.tools_for(cmake_args)
    for tool in llama_tools.TOOLS:  # the tree may hold more than was asked for
        make_exe(tree / "bin" / llama_tools.exe_name(tool, system))
    for lib in ("libggml.so", "libllama.so.0", "libggml.dylib", "libllama.0.dylib", "ggml.dll"):
        (tree / "bin" / lib).write_text("lib")
    calls: list[list[str]] = []
    monkeypatch.setattr(llama_tools, "_run", calls.append)
    llama_tools._build_in_tree(tree, src, 2, out, tools=tools, cmake="/venv/bin/cmake")

    configure, build = calls
    assert configure[:5] == ["/venv/bin/cmake", "-S", str(src), "-B", str(tree)]
    rpath = "@loader_path" if system == "Darwin" else "$ORIGIN"
    assert f"-DCMAKE_BUILD_RPATH={rpath}" in configure
    assert build[build.index("--target") + 1:] == list(tools)
    assert ("ggml-rpc-server" in build) == buildflags.has_rpc(cmake_args)
    copied = sorted(p.name for p in out.iterdir())
    libs = {"Darwin": ["libggml.dylib", "libllama.0.dylib"], "Windows": ["ggml.dll"]}.get(
        system, ["libggml.so", "libllama.so.0"])
    assert copied == sorted([*(llama_tools.exe_name(t, system) for t in tools), *libs])


def test_windows_tools_are_exe_files(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setattr(llama_tools.platform, "system", lambda: "Windows")
    monkeypatch.delenv(llama_tools.SERVER_ENV, raising=False)
    monkeypatch.setenv("SPRINTER_EDGE_TOOLS", str(tmp_path))
    monkeypatch.setenv("CMAKE_ARGS", WITH_RPC)
    spec = llama_tools.build_spec()
    for tool in spec.tools:
        make_exe(spec.bin / tool)  # no .exe: not what a Windows build makes
    assert llama_tools.where(spec) is None
    for tool in spec.tools:
        make_exe(spec.bin / f"{tool}.exe")
    assert llama_tools.where(spec) == spec.bin
    assert llama_tools.find_tool(llama_tools.RPC_SERVER) == spec.bin / "ggml-rpc-server.exe"


def test_cmake_from_the_venv_when_the_system_has_none(monkeypatch, tmp_path: Path) -> None:
    venv_bin = tmp_path / "venv" / "bin"
    make_exe(venv_bin / "cmake")
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.setattr(llama_tools.sys, "executable", str(venv_bin / "python"))
    assert llama_tools.find_cmake() == str(venv_bin / "cmake")
    (venv_bin / "cmake").unlink()
    assert llama_tools.find_cmake() is None


def test_the_cmake_hint_names_the_platforms_installers() -> None:
    mac = llama_tools.cmake_hint("Darwin")
    assert "brew install cmake" in mac and "pip install cmake" in mac and "apt" not in mac
    assert "apt-get install cmake" in llama_tools.cmake_hint("Linux")
    assert llama_tools.cmake_hint("Windows") == "pip install cmake (PyPI's, into this venv)"


def test_no_cmake_is_one_error_with_the_hint(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setenv("SPRINTER_EDGE_TOOLS", str(tmp_path))
    monkeypatch.setattr(llama_tools, "find_cmake", lambda: None)
    monkeypatch.setattr(llama_tools.platform, "system", lambda: "Darwin")
    spec = llama_tools.BuildSpec("0.3.36", NO_RPC, "a test")
    with pytest.raises(llama_tools.ToolsError, match="brew install cmake"):
        llama_tools.build(spec=spec)


def test_the_shell_script_hands_on_the_merged_cmake_args(tmp_path: Path) -> None:
    """tools/build_llama_server.sh with a user's CMAKE_ARGS looks up (and would build) the tools
    for the chosen flags with the user's added, as tools/setup.sh built the wheel."""
    env = {**os.environ, "CMAKE_ARGS": "-DGGML_METAL=on", "SPRINTER_EDGE_TOOLS": str(tmp_path),
           "PYTHON": sys.executable}
    proc = subprocess.run(["bash", str(ROOT / "tools" / "build_llama_server.sh"), "where"], env=env,
                          capture_output=True, text=True, timeout=60)
    merged = buildflags.merge_cmake_args(buildflags.recommend().cmake_args, "-DGGML_METAL=on").cmake_args
    assert proc.returncode == 1
    assert f"CMAKE_ARGS={merged!r}" in proc.stderr and "-DGGML_RPC=ON" in merged
