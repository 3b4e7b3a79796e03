"""The defaults a laptop gets, by simulation: the threads (performance cores), the GPU layers
(every layer where the build has a GPU here), the default context from the free memory, and the
cost tables' key per device, for darwin-arm64, darwin-x86_64, linux-aarch64, linux-x86_64 and
win32-amd64. Nothing here needs those machines: `platform.system()`, `os.cpu_count()`, the
commands `sysctl` / `vm_stat` (backend/host.py's `run`), /sys and /proc (pointed at files of the
test's own, or at nothing) and llama.cpp's answer on GPU offload are patched. A few checks load
the fixture model (cheap) to see what the engine really asks llama.cpp for."""

from __future__ import annotations

import os
import platform
import sys
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import pytest

from sprinter_edge import Engine, Hardware, SamplingParams
from sprinter_edge.backend import host, native
from sprinter_edge.backend.llama import (
    AUTO_CTX,
    LlamaModel,
    LoadOptions,
    context_for,
    default_gpu_layers,
    placement_from_log,
)
from sprinter_edge.costs.table import _machine_key

GIB = 1 << 30
DEFAULT_TARGET_KV = 28 * 1024  # the default pair's target: 28 KiB of KV cache a token (f16)
SMOLLM2_KV = 2 * 2 * 30 * 3 * 64  # the fixture: K and V, f16, 30 layers, 3 KV heads of 64
METAL = "Metal (Apple M2 Pro)"


def vm_stat(page: int, free: int, inactive: int, speculative: int) -> str:
    """`vm_stat`'s output as macOS prints it (its "Pages free" leaves the speculative ones out)."""
    return (f"Mach Virtual Memory Statistics: (page size of {page} bytes)\n"
            f"Pages free:                               {free}.\n"
            f"Pages active:                             123456.\n"
            f"Pages inactive:                           {inactive}.\n"
            f"Pages speculative:                        {speculative}.\n"
            f"Pages throttled:                                 0.\n"
            f"Pages wired down:                         98765.\n"
            f"Pages purgeable:                           4321.\n")


def fake_sys(root: Path, siblings: list[str], *, performance: str | None = None) -> Path:
    """/sys/devices with cpuN/topology/thread_siblings_list per logical CPU (and cpu_core/cpus,
    the performance cores of an Intel hybrid)."""
    for cpu, sib in enumerate(siblings):
        topo = root / "system" / "cpu" / f"cpu{cpu}" / "topology"
        topo.mkdir(parents=True)
        (topo / "thread_siblings_list").write_text(sib + "\n")
    if performance is not None:
        (root / "cpu_core").mkdir(parents=True)
        (root / "cpu_core" / "cpus").write_text(performance + "\n")
    return root


@pytest.fixture
def simulate(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Callable[..., None]:
    """simulate(name, cpus, commands={...}, sys_devices=..., meminfo=..., ...): this process
    looks like `name` (e.g. "darwin-arm64") with `cpus` logical CPUs; `commands` maps a
    command line to its output (missing: the command fails); /sys, /proc/meminfo and
    /proc/cpuinfo are missing unless given."""

    def apply(name: str, cpus: int | None, *, commands: dict[tuple[str, ...], str] | None = None,
              sys_devices: Path | None = None, meminfo: str | None = None, cpuinfo: str | None = None,
              windows_cores: int | None = None, windows_free: int | None = None) -> None:
        plat, machine = name.split("-")
        system = {"darwin": "Darwin", "linux": "Linux", "win32": "Windows"}[plat]
        monkeypatch.setattr(sys, "platform", plat)
        monkeypatch.setattr(platform, "system", lambda: system)
        monkeypatch.setattr(platform, "machine", lambda: machine)
        monkeypatch.setattr(os, "cpu_count", lambda: cpus)
        if system == "Linux":
            monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(cpus or 0)), raising=False)
        else:  # neither macOS nor Windows has it
            monkeypatch.delattr(os, "sched_getaffinity", raising=False)
        outputs = commands or {}
        monkeypatch.setattr(host, "run", lambda args: outputs.get(tuple(args)))
        missing = tmp_path / "missing"
        monkeypatch.setattr(host, "SYS_DEVICES", sys_devices or missing / "sys" / "devices")
        for attr, text, fname in (("PROC_MEMINFO", meminfo, "meminfo"), ("PROC_CPUINFO", cpuinfo, "cpuinfo")):
            path = missing / "proc" / fname
            if text is not None:
                path = tmp_path / fname
                path.write_text(text)
            monkeypatch.setattr(host, attr, path)
        monkeypatch.setattr(host, "windows_core_count", lambda: windows_cores)
        monkeypatch.setattr(host, "windows_free_memory", lambda: windows_free)

    return apply


@pytest.fixture
def gpu_build(monkeypatch: pytest.MonkeyPatch) -> Callable[..., None]:
    """gpu_build(devices): llama.cpp reports GPU offload, with these local GPU devices (the RPC
    backend every tools/setup.sh build has makes `llama_supports_gpu_offload()` true by itself:
    a GPU device is what tells)."""

    def apply(devices: list[str] | None = None, *, rpc: bool = True) -> None:
        monkeypatch.setattr(native.llama_cpp, "llama_supports_gpu_offload", lambda: True)
        monkeypatch.setattr(native.llama_cpp, "llama_supports_rpc", lambda: rpc)
        monkeypatch.setattr(native, "gpu_devices", lambda: devices)

    return apply


# ------------------------------------------------------------------------------ threads

def test_darwin_arm64_threads_are_the_performance_cores(simulate) -> None:
    simulate("darwin-arm64", 12, commands={("sysctl", "-n", "hw.perflevel0.physicalcpu"): "8\n",
                                           ("sysctl", "-n", "hw.physicalcpu"): "12\n"})
    assert host.performance_cores() == 8
    assert LoadOptions().threads() == 8
    assert Hardware().options("target").threads() == Hardware().options("draft").threads() == 8
    assert LoadOptions(n_threads=3).threads() == 3  # --threads wins


def test_darwin_x86_64_threads_are_the_physical_cores(simulate) -> None:
    # an Intel Mac has no perflevels: hw.physicalcpu (4 cores, 8 hyperthreads)
    simulate("darwin-x86_64", 8, commands={("sysctl", "-n", "hw.physicalcpu"): "4\n"})
    assert host.performance_cores() == 4


def test_darwin_without_sysctl_falls_back_as_llama_cpp(simulate) -> None:
    simulate("darwin-arm64", 10)  # sysctl fails: llama.cpp's fallback, the CPUs halved above 4
    assert host.performance_cores() == 5


def test_linux_aarch64_one_thread_a_core(simulate, tmp_path: Path) -> None:
    simulate("linux-aarch64", 4, sys_devices=fake_sys(tmp_path / "sys", ["0", "1", "2", "3"]))
    assert host.performance_cores() == 4


def test_linux_x86_64_hyperthreads_are_not_counted(simulate, tmp_path: Path) -> None:
    siblings = ["0,4", "1,5", "2,6", "3,7"] * 2  # cpu N and N+4 share a core
    simulate("linux-x86_64", 8, sys_devices=fake_sys(tmp_path / "sys", siblings))
    assert host.performance_cores() == 4


def test_linux_x86_64_intel_hybrid_leaves_the_efficiency_cores_out(simulate, tmp_path: Path) -> None:
    # 6 P-cores with hyperthreads (cpus 0-11) and 8 E-cores (12-19), as an i7-12700H
    siblings = [f"{2 * (c // 2)}-{2 * (c // 2) + 1}" for c in range(12)] + [str(c) for c in range(12, 20)]
    simulate("linux-x86_64", 20, sys_devices=fake_sys(tmp_path / "sys", siblings, performance="0-11"))
    assert host.performance_cores() == 6


def test_linux_counts_only_the_cpus_it_may_run_on(simulate, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    siblings = ["0,4", "1,5", "2,6", "3,7"] * 2
    simulate("linux-x86_64", 8, sys_devices=fake_sys(tmp_path / "sys", siblings))
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 4, 1})  # a container's cpuset
    assert host.performance_cores() == 2


def test_linux_without_sys_reads_proc_cpuinfo(simulate) -> None:
    cpuinfo = "\n\n".join(f"processor\t: {n}\nphysical id\t: 0\ncore id\t\t: {n % 4}" for n in range(8))
    simulate("linux-x86_64", 8, cpuinfo=cpuinfo)
    assert host.performance_cores() == 4


@pytest.mark.parametrize(("cpus", "threads"), [(2, 2), (4, 4), (16, 8), (1, 1)])
def test_linux_without_sys_or_proc_falls_back_as_llama_cpp(simulate, cpus: int, threads: int) -> None:
    simulate("linux-x86_64", cpus)
    assert host.performance_cores() == threads


def test_win32_amd64_threads(simulate) -> None:
    simulate("win32-amd64", 16, windows_cores=8)  # GetLogicalProcessorInformationEx: 8 cores
    assert host.performance_cores() == 8
    simulate("win32-amd64", 16)  # the call failed: llama.cpp's fallback
    assert host.performance_cores() == 8
    simulate("win32-amd64", 4)
    assert host.performance_cores() == 4


@pytest.mark.parametrize("name", ["linux-x86_64", "darwin-arm64", "win32-amd64"])
def test_nothing_known_still_gives_one_thread(simulate, name: str) -> None:
    simulate(name, None)  # os.cpu_count() may say None
    assert host.performance_cores() == 1


def test_this_machine_keeps_its_threads() -> None:
    """Here (the 2-core VM the figures are measured on: 2 cores, a thread each) the default is
    what it was, os.cpu_count()."""
    cores = host.linux_physical_cores() if platform.system() == "Linux" else None
    if cores is not None and cores == os.cpu_count():
        assert LoadOptions().threads() == os.cpu_count()
    assert LoadOptions().threads() >= 1


# ------------------------------------------------------------------------------ memory and context

def test_darwin_free_memory_from_vm_stat(simulate) -> None:
    simulate("darwin-arm64", 12, commands={("vm_stat",): vm_stat(16384, 20000, 30000, 10000),
                                           ("sysctl", "-n", "hw.memsize"): str(32 * GIB)})
    assert host.free_memory() == 60000 * 16384  # free + inactive + speculative pages
    assert context_for(32768, DEFAULT_TARGET_KV, host.free_memory()) == 4096


def test_darwin_x86_64_pages_of_4_kib(simulate) -> None:
    simulate("darwin-x86_64", 8, commands={("vm_stat",): vm_stat(4096, 1_000_000, 2_000_000, 194_304)})
    assert host.free_memory() == 3_194_304 * 4096
    assert context_for(32768, DEFAULT_TARGET_KV, host.free_memory()) == AUTO_CTX  # 13 GB: the cap


def test_darwin_without_vm_stat_uses_the_whole_memory(simulate) -> None:
    simulate("darwin-arm64", 8, commands={("sysctl", "-n", "hw.memsize"): f"{16 * GIB}\n"})
    assert host.free_memory() == 16 * GIB


def test_linux_free_memory_is_mem_available(simulate) -> None:
    meminfo = "MemTotal:        8000000 kB\nMemFree:          100000 kB\nMemAvailable:    2000000 kB\n"
    simulate("linux-aarch64", 4, meminfo=meminfo)
    assert host.free_memory() == 2_000_000 * 1024
    # 2 GB free: an eighth of it holds ~8.9k tokens of the default target's KV cache
    assert context_for(32768, DEFAULT_TARGET_KV, host.free_memory()) == 8704


def test_linux_without_proc_keeps_todays_fallback(simulate) -> None:
    simulate("linux-x86_64", 2)
    assert host.free_memory() == os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def test_win32_free_memory(simulate, monkeypatch: pytest.MonkeyPatch) -> None:
    simulate("win32-amd64", 8, windows_free=3 * GIB)
    assert host.free_memory() == 3 * GIB
    simulate("win32-amd64", 8)  # GlobalMemoryStatusEx failed, and Windows has no os.sysconf
    monkeypatch.delattr(os, "sysconf", raising=False)
    assert host.free_memory() == host.FALLBACK_MEMORY


def test_context_rule() -> None:
    assert context_for(32768, DEFAULT_TARGET_KV, 64 * GIB) == AUTO_CTX
    assert context_for(4096, DEFAULT_TARGET_KV, 64 * GIB) == 4096  # the trained context
    assert context_for(32768, DEFAULT_TARGET_KV, 100 << 20) == 2048  # never under 2048


def test_default_context_of_a_loaded_model_follows_free_memory(simulate, fixture_target_path: Path) -> None:
    free_pages = 8192  # 128 MiB of 16 KiB pages free
    simulate("darwin-arm64", 2, commands={("vm_stat",): vm_stat(16384, free_pages, 0, 0)})
    with LlamaModel(fixture_target_path, LoadOptions(n_threads=1)) as model:
        expected = context_for(8192, SMOLLM2_KV, free_pages * 16384)
        assert (model.n_ctx, expected) == (2048, 2048)
    simulate("darwin-arm64", 2, commands={("vm_stat",): vm_stat(16384, 65536, 0, 0)})  # 1 GiB
    with LlamaModel(fixture_target_path, LoadOptions(n_threads=1)) as model:
        assert model.n_ctx == context_for(8192, SMOLLM2_KV, GIB) == 5632


# ------------------------------------------------------------------------------ GPU layers

def test_this_build_keeps_the_layers_on_the_cpu() -> None:
    """Here (a CPU build with llama.cpp's RPC backend, no GPU): nothing changes; on a machine whose
    build has a GPU, every layer goes there."""
    every = -1 if native.gpu_offload_supported() else 0
    assert default_gpu_layers() == every
    assert LoadOptions().n_gpu_layers == every
    hw = Hardware()
    assert (hw.options("target").n_gpu_layers, hw.options("draft").n_gpu_layers) == (every, every)


@pytest.mark.parametrize("name", ["darwin-arm64", "darwin-x86_64", "linux-aarch64", "linux-x86_64",
                                  "win32-amd64"])
def test_a_gpu_build_offloads_every_layer_by_default(simulate, gpu_build, name: str) -> None:
    simulate(name, 8)
    gpu_build([METAL if name.startswith("darwin") else "CUDA0 (NVIDIA GeForce RTX 4060 Laptop GPU)"])
    assert default_gpu_layers() == -1
    assert LoadOptions().n_gpu_layers == -1
    hw = Hardware()
    assert (hw.options("target").n_gpu_layers, hw.options("draft").n_gpu_layers) == (-1, -1)
    assert Hardware(target_gpu_layers=0).options("target").n_gpu_layers == 0


def test_rpc_alone_is_no_gpu(gpu_build) -> None:
    gpu_build([])  # llama_supports_gpu_offload() says yes for the RPC backend alone
    assert not native.gpu_offload_supported() and default_gpu_layers() == 0
    gpu_build(None, rpc=False)  # a build without RPC: llama.cpp's answer is the GPU's
    assert native.gpu_offload_supported() and default_gpu_layers() == -1


def test_no_gpu_offload_no_layers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(native.llama_cpp, "llama_supports_gpu_offload", lambda: False)
    assert default_gpu_layers() == 0 and LoadOptions().n_gpu_layers == 0


def _hardware(argv: list[str]) -> Hardware:
    from sprinter_edge.cli import build_parser
    from sprinter_edge.cli.common import hardware_from

    return hardware_from(build_parser().parse_args(["generate", "hi", *argv]))


def test_cli_flags_on_a_gpu_build(gpu_build) -> None:
    gpu_build([METAL])
    layers = lambda hw: (hw.target_gpu_layers, hw.draft_gpu_layers)  # noqa: E731
    assert layers(_hardware([])) == (-1, -1)
    assert layers(_hardware(["--gpu"])) == (-1, -1)
    assert layers(_hardware(["--cpu"])) == (0, 0)
    assert layers(_hardware(["--cpu", "--target-gpu-layers", "12"])) == (12, 0)  # explicit wins
    assert layers(_hardware(["--draft-gpu-layers", "0"])) == (-1, 0)
    with pytest.raises(SystemExit):
        _hardware(["--cpu", "--gpu"])


def test_cli_flags_on_a_cpu_build(caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(native, "gpu_offload_supported", lambda: False)
    hw = _hardware([])
    assert (hw.target_gpu_layers, hw.draft_gpu_layers) == (0, 0)
    with caplog.at_level("WARNING"):
        hw = _hardware(["--gpu"])  # asked for: requested, and said to stay on the CPU
    assert (hw.target_gpu_layers, hw.draft_gpu_layers) == (-1, -1)
    assert "no GPU offload" in caplog.text


def test_flash_attention_stays_right() -> None:
    # repacked weights on the CPU: off; layers on a GPU: llama.cpp's choice
    assert LoadOptions(n_gpu_layers=0).flash_attn_type(repacked=True) == 0
    assert LoadOptions(n_gpu_layers=-1).flash_attn_type(repacked=True) == -1
    assert LoadOptions(n_gpu_layers=-1).flash_attn_type(repacked=False) == -1


# ------------------------------------------------------------------------------ cost tables

def test_cost_key_names_the_device_only_when_layers_are_offloaded(gpu_build) -> None:
    cpu_key = _machine_key(LoadOptions(n_gpu_layers=0, n_threads=2))
    assert "device" not in cpu_key  # the tables users have stay valid
    gpu_build([METAL])
    assert _machine_key(LoadOptions(n_gpu_layers=0, n_threads=2)) == cpu_key  # --cpu: the same table
    gpu_key = _machine_key(LoadOptions(n_threads=2))
    assert gpu_key["device"] == METAL and gpu_key["gpu_layers"] == -1
    gpu_build(["CUDA0 (NVIDIA GeForce RTX 4060 Laptop GPU)"])
    assert _machine_key(LoadOptions(n_threads=2))["device"] != METAL  # a table per GPU
    rpc_key = _machine_key(LoadOptions(n_threads=2, rpc=("10.0.0.2:50052",)))
    assert "device" not in rpc_key and rpc_key["rpc"] == ["10.0.0.2:50052"]  # keyed by the route


@pytest.mark.parametrize("name", ["darwin-arm64", "darwin-x86_64", "linux-aarch64", "linux-x86_64",
                                  "win32-amd64"])
def test_cost_key_per_platform(simulate, gpu_build, name: str) -> None:
    simulate(name, 8, commands={("sysctl", "-n", "hw.perflevel0.physicalcpu"): "4\n"},
             windows_cores=4, cpuinfo="processor\t: 0\nphysical id\t: 0\ncore id\t: 0\n\n"
             "processor\t: 1\nphysical id\t: 0\ncore id\t: 1\n\n"
             "processor\t: 2\nphysical id\t: 0\ncore id\t: 2\n\n"
             "processor\t: 3\nphysical id\t: 0\ncore id\t: 3\n")
    key = _machine_key(LoadOptions())
    assert key["machine"] == name.split("-")[1] and key["threads"] == 4
    assert "device" not in key or native.gpu_offload_supported()
    gpu_build([METAL])
    assert _machine_key(LoadOptions())["device"] == METAL


# ------------------------------------------------------------------------------ where the layers are

def test_placement_from_llama_cpp_log() -> None:
    metal = [(2, "llama_model_load_from_file_impl: using device Metal (Apple M2 Pro) (unknown id) - "
                 "21845 MiB free"), (2, "load_tensors: offloading output layer to GPU"),
             (2, "load_tensors: offloaded 31/31 layers to GPU")]
    assert placement_from_log(metal, 31) == (31, 31, [METAL])
    # a CPU build with the RPC backend says it offloaded them, with no device to put them on
    assert placement_from_log([(2, "load_tensors: offloaded 31/31 layers to GPU")], 31) == (0, 31, [])
    assert placement_from_log([], 31) == (0, 31, [])

    def where(gpu: int, devices: list[str], rpc: tuple[str, ...] = ()) -> str:
        model = SimpleNamespace(gpu_layers=gpu, layers=31, devices=devices, options=SimpleNamespace(rpc=rpc),
                                rpc_devices=object() if rpc else None)
        return LlamaModel.placement(model)  # type: ignore[arg-type]

    assert where(31, [METAL]) == "31/31 layers on GPU (Metal)"
    assert where(20, [METAL]) == "20/31 layers on GPU (Metal), the rest on the CPU"
    assert where(0, [METAL]) == "on the CPU"
    assert (where(31, ["RPC0 (10.0.0.2:50052)"], ("10.0.0.2:50052",))
            == "31/31 layers on rpc-server 10.0.0.2:50052")


def test_doctor_says_where_the_layers_go(gpu_build, capsys: pytest.CaptureFixture[str]) -> None:
    from sprinter_edge.cli import main

    assert main(["doctor", "--no-timing"]) == 0
    out = capsys.readouterr().out
    if not native.gpu_offload_supported():
        assert "  layers        on the CPU (this build has no GPU offload)" in out
    gpu_build([METAL])
    assert main(["doctor", "--no-timing"]) == 0
    out = capsys.readouterr().out
    assert f"  gpu offload   yes: {METAL}" in out
    assert "  layers        every layer of both models on the GPU by default" in out
    assert f"  threads       {host.performance_cores()} " in out


# ------------------------------------------------------------------------------ real loads, here

def test_default_generate_here_asks_for_no_gpu_layers(fixture_target_path: Path, fixture_draft_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """A default `generate` on the fixture pair with GPU offload reported false: 0 layers asked,
    both models on the CPU, and the server's /health says so."""
    from fastapi import testclient

    from sprinter_edge.cli import build_parser
    from sprinter_edge.cli.common import hardware_from
    from sprinter_edge.serving.server import create_app

    monkeypatch.setattr(native.llama_cpp, "llama_supports_gpu_offload", lambda: False)
    args = build_parser().parse_args(["generate", "hi", "--ctx", "512", "--threads", "1"])
    with Engine(fixture_target_path, fixture_draft_path, method="sd", hardware=hardware_from(args)) as engine:
        engine.generate("def add(a, b):", SamplingParams(max_tokens=4))
        for model in (engine.target, engine.draft):
            assert model.options.n_gpu_layers == 0 and model.gpu_layers == 0
        assert engine.models.placement() == "target and draft on the CPU (this build has no GPU offload)"
        assert engine.models.layers_on() == "CPU"
        with testclient.TestClient(create_app(engine, model_id="fixture")) as client:
            health = client.get("/health").json()
        assert health["layers_on"] == "CPU" and "on the CPU" in health["layers"]


def test_default_generate_with_gpu_offload_asks_for_every_layer(fixture_target_path: Path,
                                                                fixture_draft_path: Path, gpu_build) -> None:
    """With llama.cpp reporting a GPU (simulated), a default `generate` asks for every layer of
    both models on it (this build has none: llama.cpp keeps them on the CPU, and says so)."""
    gpu_build([METAL])
    with Engine(fixture_target_path, fixture_draft_path, method="sd",
                hardware=Hardware(n_ctx=512, n_threads=1)) as engine:
        engine.generate("def add(a, b):", SamplingParams(max_tokens=4))
        for model in (engine.target, engine.draft):
            assert model.options.n_gpu_layers == -1
            assert model.gpu_layers == 0  # no GPU device here: none went there
