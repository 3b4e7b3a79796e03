"""The models users already have (catalog/local.py, catalog/gguf_header.py, `sprinter-edge models`,
`--target NAME`): Ollama's, LM Studio's, the Hugging Face cache's and a user folder's GGUF files,
built in a temporary home from the fixture pair (tests/support/local_stores.py); listed from
their headers alone, named, paired with a draft by tokenizer, and never changed."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support.local_stores import LMSTUDIO_NAME, Machine, build, point_at, subprocess_env

from sprinter_edge.catalog import gguf_header, local
from sprinter_edge.catalog.gguf_header import read_gguf_info
from sprinter_edge.errors import ModelFileError, SettingsError

HF_NAME = "hf:HuggingFaceTB/SmolLM2-135M-Instruct-GGUF/smollm2-135m-instruct-q4_1.gguf"


@pytest.fixture(scope="module")
def machine(tmp_path_factory: pytest.TempPathFactory, fixture_target_path: Path,
            fixture_draft_path: Path) -> Machine:
    return build(tmp_path_factory.mktemp("machine") / "home", fixture_target_path, fixture_draft_path)


@pytest.fixture(scope="module")
def before(machine: Machine) -> dict[Path, str]:
    """Every store file's sha256 before any test here used the stores."""
    return machine.files()


@pytest.fixture
def on_machine(machine: Machine, before: dict[Path, str], monkeypatch: pytest.MonkeyPatch) -> Machine:
    point_at(machine, monkeypatch)
    return machine


# ---------------------------------------------------------------------------- the header
def test_header_of_the_fixture(fixture_target_path: Path, fixture_draft_path: Path) -> None:
    target, draft = read_gguf_info(fixture_target_path), read_gguf_info(fixture_draft_path)
    assert (target.architecture, target.context_length, target.n_vocab) == ("llama", 8192, 49152)
    assert target.file_type == "Q4_1" and target.params_label == "135M" and target.complete
    assert target.tokenizer_model == "gpt2"
    assert draft.tokenizer == target.tokenizer  # the loader's check passes for this pair (conftest)
    assert draft.n_params < target.n_params and draft.complete
    # only the header was read: the tensors start at data_offset; one chunk past it at most
    assert target.bytes_read <= target.data_offset + gguf_header.CHUNK < target.file_size // 10


@pytest.mark.slow
def test_header_agrees_with_ggufs_reader(fixture_target_path: Path) -> None:
    """The parameter count and where the data ends, against ggml-org's own reader."""
    from gguf import GGUFReader

    reader = GGUFReader(str(fixture_target_path))
    info = read_gguf_info(fixture_target_path)
    assert info.n_params == sum(int(t.n_elements) for t in reader.tensors)
    assert info.data_offset == reader.data_offset
    assert info.data_end == max(int(t.data_offset) + int(t.n_bytes) for t in reader.tensors)


def test_tensor_sizes_match_gguf() -> None:
    from gguf.constants import GGML_QUANT_SIZES

    ours = gguf_header.TENSOR_TYPES
    assert {int(k): tuple(v) for k, v in GGML_QUANT_SIZES.items() if int(k) in ours} == ours


def test_fingerprint_follows_the_tokenizer_and_chunks(tmp_path: Path, fixture_target_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    from support.local_stores import write_foreign_gguf

    write_foreign_gguf(tmp_path / "a.gguf")
    foreign = read_gguf_info(tmp_path / "a.gguf")
    assert foreign.n_vocab == 300 and foreign.complete and foreign.n_params == 2400
    assert foreign.tokenizer != read_gguf_info(fixture_target_path).tokenizer
    whole = read_gguf_info(fixture_target_path).tokenizer
    monkeypatch.setattr(gguf_header, "CHUNK", 4099)  # strings cut across every chunk's end
    assert read_gguf_info(fixture_target_path).tokenizer == whole


@pytest.mark.parametrize("cut", [3, 40, 100_000])
def test_a_cut_header_is_one_line(tmp_path: Path, fixture_target_path: Path, cut: int) -> None:
    bad = tmp_path / "cut.gguf"
    bad.write_bytes(fixture_target_path.read_bytes()[:cut])
    with pytest.raises(ModelFileError, match="truncated GGUF header|bad magic") as err:
        read_gguf_info(bad)
    assert "\n" not in str(err.value)


def test_not_gguf_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "x.gguf").write_bytes(b"<html>not found</html>" * 10)
    with pytest.raises(ModelFileError, match="not a GGUF file"):
        read_gguf_info(tmp_path / "x.gguf")


# ---------------------------------------------------------------------------- finding them
def test_every_store_is_found(on_machine: Machine) -> None:
    found = local.find_models()
    assert [m.name for m in found.models] == [
        "ollama:smollm2:135m", "ollama:smollm2:broken", LMSTUDIO_NAME, HF_NAME, "dir:cut-header.gguf",
        "dir:foreign.gguf"]
    by_name = {m.name: m for m in found.models}
    for name, path in on_machine.names.items():
        assert by_name[name].path == path
    assert "truncated: the file has" in by_name["ollama:smollm2:broken"].problem
    assert "truncated GGUF header" in by_name["dir:cut-header.gguf"].problem
    assert [m.name for m in found.usable()] == ["ollama:smollm2:135m", LMSTUDIO_NAME, HF_NAME,
                                                "dir:foreign.gguf"]
    groups = found.tokenizer_groups()
    assert len(groups) == 2  # SmolLM2's (four files) and the foreign one's


def test_ollama_default_stores(tmp_path: Path, on_machine: Machine, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OLLAMA_MODELS")
    monkeypatch.setattr(local, "OLLAMA_SYSTEM_STORE", tmp_path / "system")
    system = [tmp_path / "system"] if sys.platform.startswith("linux") else []
    assert local.ollama_stores() == [on_machine.home / ".ollama" / "models", *system]
    assert "ollama:smollm2:135m" in [m.name for m in local.find_models().models]  # ~/.ollama/models


def test_other_namespaces_and_bad_manifests(on_machine: Machine, tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    store = tmp_path / "ollama"
    manifests = store / "manifests"
    for parts, text in ((("registry.ollama.ai", "someone", "coder", "7b"), "{}"),
                        (("hf.co", "bartowski", "Foo-GGUF", "Q4_K_M"), "not json"),
                        (("registry.ollama.ai", "library", "gone", "latest"),
                         json.dumps({"layers": [{"mediaType": local.OLLAMA_MODEL_LAYER,
                                                 "digest": "sha256:ab"}]}))):
        (manifests.joinpath(*parts)).parent.mkdir(parents=True, exist_ok=True)
        manifests.joinpath(*parts).write_text(text)
    monkeypatch.setenv("OLLAMA_MODELS", str(store))
    found = {m.name: m for m in local.find_models().models if m.source == "ollama"}
    assert set(found) == {"ollama:someone/coder:7b", "ollama:hf.co/bartowski/Foo-GGUF:Q4_K_M",
                          "ollama:gone:latest"}
    assert "manifest" in found["ollama:someone/coder:7b"].problem
    assert "unreadable Ollama manifest" in found["ollama:hf.co/bartowski/Foo-GGUF:Q4_K_M"].problem
    assert "blob sha256-ab is missing" in found["ollama:gone:latest"].problem


def test_user_folders_from_flag_env_and_config(on_machine: Machine, tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch,
                                               fixture_draft_path: Path) -> None:
    config = on_machine.home / "config" / "sprinter-edge" / "models.toml"
    config.parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / "c").mkdir()
    config.write_text(f'dirs = ["{tmp_path / "c"}"]\nserve = ["ollama:*"]\n')
    try:
        (tmp_path / "c" / "x-00002-of-00002.gguf").write_bytes(b"")  # a split model's later part
        assert local.user_dirs(["/flag"]) == [Path("/flag"), on_machine.folder, tmp_path / "c"]
        assert local.load_config()["serve"] == ["ollama:*"]
        assert not [m for m in local.find_models().models if "x-0000" in m.name]
        config.write_text("dirs = 3\n")
        with pytest.raises(SettingsError, match="dirs must be a list"):
            local.user_dirs()
    finally:
        config.unlink()


def test_listing_reads_headers_only(on_machine: Machine, tmp_path: Path, fixture_target_path: Path,
                                    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    """50 models whose tensors are missing (each file is the fixture's header alone) still list
    in full: nothing past a header is read. The time is printed, never asserted."""
    header = fixture_target_path.read_bytes()[:read_gguf_info(fixture_target_path).data_offset]
    folder = tmp_path / "fifty"
    folder.mkdir()
    for i in range(50):
        (folder / f"model-{i:02d}.gguf").write_bytes(header)
    monkeypatch.setenv(local.ENV_DIRS, str(folder))
    monkeypatch.setenv("SPRINTER_EDGE_HOME", str(tmp_path / "cache"))
    cache = local.HeaderCache()
    start = time.perf_counter()
    found = local.find_models(cache=cache)
    seconds = time.perf_counter() - start
    fifty = [m for m in found.models if m.name.startswith("dir:model-")]
    assert len(fifty) == 50 and cache.reads == len(found.models)  # (the stores' 4, and these)
    for m in fifty:
        assert m.info.architecture == "llama" and m.info.params_label == "135M"
        assert m.info.bytes_read <= len(header) + gguf_header.CHUNK
        assert m.problem.startswith("truncated")
    again = local.HeaderCache()
    local.find_models(cache=again)
    assert again.reads == 0  # every header from the cache
    with capsys.disabled():
        print(f"\n  listing {len(found.models)} models (50 headers of a 49k-token vocabulary): "
              f"{seconds:.2f} s, headers read anew")


# ---------------------------------------------------------------------------- names and pairs
def test_names_resolve(on_machine: Machine) -> None:
    found = local.find_models()
    assert found.lookup("ollama:smollm2:135m").name == "ollama:smollm2:135m"
    assert found.lookup("smollm2:135m").name == "ollama:smollm2:135m"
    assert found.lookup("lmstudio:smollm2-135m-first20").name == LMSTUDIO_NAME
    assert found.lookup("SmolLM2-first20-GGUF/smollm2-135m-first20.gguf").name == LMSTUDIO_NAME
    assert found.lookup(HF_NAME).name == HF_NAME
    assert found.lookup("foreign").name == "dir:foreign.gguf"
    with pytest.raises(ModelFileError, match="no model 'ollama:smollm2'.*did you mean"):
        found.lookup("ollama:smollm2")  # no tag is :latest, as in Ollama, and there is none
    with pytest.raises(ModelFileError, match="no model 'ollama:smolm2:135m'.*did you mean"):
        found.lookup("ollama:smolm2:135m")
    two = local.Found([local.LocalModel("dir:a/x.gguf", "dir", Path("a/x.gguf")),
                       local.LocalModel("dir:b/x.gguf", "dir", Path("b/x.gguf"))])
    with pytest.raises(SettingsError, match="could be any of 2 models: dir:a/x.gguf, dir:b/x.gguf"):
        two.lookup("x")


def test_pairing_picks_the_smallest_draft_with_the_tokenizer(on_machine: Machine) -> None:
    p = local.pair("ollama:smollm2:135m", None)
    # not the truncated blob (smaller, same tokenizer), not the foreign file (smallest of all),
    # not the Hub's copy of the target (not smaller)
    assert p.draft is not None and p.draft.name == LMSTUDIO_NAME and p.found_draft
    assert "draft " + LMSTUDIO_NAME in p.describe()
    assert local.pair(LMSTUDIO_NAME, None).draft is None  # nothing smaller shares its tokenizer
    assert local.pair("ollama:smollm2:135m", "none").draft is None
    named = local.pair(HF_NAME, LMSTUDIO_NAME)
    assert named.draft.name == LMSTUDIO_NAME and not named.found_draft
    with pytest.raises(ModelFileError, match="smollm2:broken.*truncated"):
        local.pair("ollama:smollm2:broken", None)


def test_a_path_stays_a_path(on_machine: Machine, fixture_target_path: Path) -> None:
    p = local.pair(str(fixture_target_path), None)
    assert p.target.source == "path" and p.draft.name == LMSTUDIO_NAME
    with pytest.raises(ModelFileError, match="model file not found"):
        local.pair("/nowhere/model.gguf", "none")


def test_no_draft_says_how_to_get_one(on_machine: Machine, capsys: pytest.CaptureFixture) -> None:
    from sprinter_edge.cli.common import pairing_from

    args = argparse.Namespace(target=LMSTUDIO_NAME, draft=None, models_dir=[], method="auto")
    assert pairing_from(args).draft is None
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no draft for " + LMSTUDIO_NAME in err and "sprinter-edge pull" in err
    assert "ar" in err and "lookup" in err
    args = argparse.Namespace(target=LMSTUDIO_NAME, draft=None, models_dir=[], method="ar")
    pairing_from(args)
    assert capsys.readouterr().err == ""  # a method that drafts nothing needs no word on it


# ---------------------------------------------------------------------------- the command line
def _cli(args: list[str], machine: Machine) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "sprinter_edge", *args], capture_output=True, text=True,
                          env=subprocess_env(machine), timeout=600)


def test_models_lists_them(on_machine: Machine) -> None:
    r = _cli(["models", "--local"], on_machine)
    assert r.returncode == 0, r.stderr
    lines = {line.split()[0]: line for line in r.stdout.splitlines()[2:] if line.startswith("  ")
             and not line.startswith("  tokenizer:")}
    target = lines["ollama:smollm2:135m"]
    for text in ("98 MB", "llama", "135M", "Q4_1", "8192", "A (49,152)", LMSTUDIO_NAME):
        assert text in target, target
    assert "cannot be used: truncated: the file has" in lines["ollama:smollm2:broken"]
    assert "cannot be used: truncated GGUF header" in lines["dir:cut-header.gguf"]
    assert "B (300)" in lines["dir:foreign.gguf"]
    listed = json.loads(_cli(["models", "--local", "--json"], on_machine).stdout)
    by_name = {e["name"]: e for e in listed}
    assert by_name["ollama:smollm2:135m"]["draft"] == LMSTUDIO_NAME
    assert by_name["ollama:smollm2:135m"]["tokenizer"] == by_name[HF_NAME]["tokenizer"]
    assert by_name["ollama:smollm2:135m"]["size"] == on_machine.names["ollama:smollm2:135m"].stat().st_size
    both = _cli(["models"], on_machine)  # the registered pairs, then these
    assert "(default)" in both.stdout and "ollama:smollm2:135m" in both.stdout


def test_generate_runs_an_ollama_name(on_machine: Machine) -> None:
    r = _cli(["generate", "--target", "ollama:smollm2:135m", "Name a colour.", "--method", "sd",
              "--max-tokens", "8", "--threads", "1", "--ctx", "512", "--stats"], on_machine)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip()
    assert f"[models] target ollama:smollm2:135m, draft {LMSTUDIO_NAME} (found here" in r.stderr
    assert "[sd]" in r.stderr


def test_a_broken_name_is_one_line(on_machine: Machine) -> None:
    r = _cli(["generate", "--target", "ollama:smollm2:broken", "hi", "--max-tokens", "2"], on_machine)
    assert r.returncode == ModelFileError.exit_code
    assert r.stderr.count("\n") == 1 and "truncated" in r.stderr and "Traceback" not in r.stderr


def test_no_store_file_changed(machine: Machine, before: dict[Path, str]) -> None:
    """Last: after every test above, every file under the stores is byte for byte what it was."""
    assert machine.files() == before
    assert not [p for p in (machine.ollama, machine.lmstudio, machine.hub, machine.folder)
                if any(q.name.endswith((".tmp", ".partial")) for q in p.rglob("*"))]
    assert os.access(machine.ollama, os.R_OK)
