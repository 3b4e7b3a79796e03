"""Flash attention is a load option: off where every layer runs on the CPU and llama.cpp repacked
the weights, unless asked for (a batched call at depth costs less without it there); llama.cpp's
choice on a GPU and where the kernels can be batch-invariant; part of the cost key; the same for
the bench's llama.cpp peers."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from sprinter_edge.backend.llama import LlamaModel, LoadOptions
from sprinter_edge.bench.llama_server import LlamaServer
from sprinter_edge.cli import build_parser
from sprinter_edge.cli.common import hardware_from
from sprinter_edge.costs import table


def test_auto_is_off_for_repacked_weights_on_the_cpu_and_llama_cpps_choice_elsewhere() -> None:
    assert LoadOptions().flash_attn_type(repacked=True) == 0
    # not repacked: the kernels can be batch-invariant, and only with flash attention
    assert LoadOptions().flash_attn_type(repacked=False) == -1
    assert LoadOptions(n_gpu_layers=999).flash_attn_type(repacked=True) == -1
    assert LoadOptions(flash_attn="on").flash_attn_type(repacked=True) == 1
    assert LoadOptions(flash_attn="off", n_gpu_layers=999).flash_attn_type(repacked=False) == 0


def test_an_unknown_setting_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="flash_attn must be one of auto, on, off"):
        LoadOptions(flash_attn="yes")
    with pytest.raises(SystemExit):
        build_parser().parse_args(["generate", "hi", "--flash-attn", "yes"])


def test_the_flag_reaches_both_models_and_the_cost_key() -> None:
    hardware = hardware_from(build_parser().parse_args(["generate", "hi", "--flash-attn", "on"]))
    assert hardware.options("target").flash_attn == hardware.options("draft").flash_attn == "on"
    default = hardware_from(build_parser().parse_args(["generate", "hi"]))
    assert default.options("target").flash_attn == "auto"
    # a table timed with flash attention on is not the one of a load with it off
    assert table._machine_key(hardware.options("target")) != table._machine_key(default.options("target"))


def test_llama_server_peers_attend_as_the_engine_does() -> None:
    server = LlamaServer("llama-server-ngram-mod", Path("llama-server"), Path("t.gguf"), flash_attn="off")
    assert server.args[server.args.index("-fa") + 1] == "off"


def _context_says(caplog: pytest.LogCaptureFixture, path: Path,
                  options: LoadOptions) -> tuple[LlamaModel, list[str]]:
    caplog.clear()
    with caplog.at_level(logging.DEBUG, logger="sprinter_edge.llama_cpp"):
        model = LlamaModel(path, options)
    return model, [r.getMessage() for r in caplog.records if "flash_attn  " in r.getMessage()]


@pytest.mark.integration
def test_llama_cpp_builds_the_context_as_asked(fixture_target_path: Path,
                                               caplog: pytest.LogCaptureFixture) -> None:
    """llama.cpp's own report of the context it made (its log), for each setting; the fixture's
    Q4_1 weights are not repacked, so `auto` leaves it to llama.cpp."""
    for setting, word in (("on", "enabled"), ("off", "disabled"), ("auto", "auto")):
        model, said = _context_says(caplog, fixture_target_path, LoadOptions(n_ctx=256, n_threads=1,
                                                                             flash_attn=setting))
        try:
            assert said and all(word in line for line in said), said
            assert not model.repacked and model.flash_attn == setting
            assert model.eval(model.tokenize("def add(a, b):"), n_logits=1).logits.shape[0] == 1
        finally:
            model.close()


@pytest.mark.integration
def test_repacked_weights_attend_without_it(default_pair_paths: tuple[Path, Path],
                                            monkeypatch: pytest.MonkeyPatch,
                                            caplog: pytest.LogCaptureFixture) -> None:
    """The default pair's draft (Q4_0) is repacked on x86 CPUs with AVX2 or better."""
    monkeypatch.setenv("SPRINTER_EDGE_EXTRA_BUFFERS", "1")
    draft = default_pair_paths[0]
    model, said = _context_says(caplog, draft, LoadOptions(n_ctx=256, n_threads=1))
    try:
        if not model.repacked:
            pytest.skip("llama.cpp repacks no weight of this file on this CPU")
        assert model.flash_attn == "off" and said and all("disabled" in line for line in said), said
    finally:
        model.close()
