"""Getting model files: the offline PyPI mirror, and the Hub through a local stand-in."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from hub_standin import HubStandIn

from sprinter_edge.catalog.registry import load_registry, parse_registry
from sprinter_edge.catalog.store import assemble_from_mirror, ensure_model, mirror_parts, sha256_file
from sprinter_edge.errors import ChecksumError, RegistryError

REVISION = "0123456789abcdef0123456789abcdef01234567"


def test_registry_has_the_default_pair() -> None:
    reg = load_registry()
    pair = reg.pair("default")
    assert pair.draft.repo == "Qwen/Qwen2.5-Coder-0.5B-Instruct-GGUF"
    assert pair.target.sha256 == "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"
    assert pair.draft.mirror and len(pair.draft.mirror.packages) == 6
    assert pair.target.mirror and len(pair.target.mirror.packages) == 22
    assert len(reg.pairs) >= 4
    for p in reg.pairs.values():
        assert p.draft.license and p.target.license and p.tokenizer


def test_unknown_pair_and_malformed_registry() -> None:
    with pytest.raises(RegistryError, match="unknown pair"):
        load_registry().pair("no-such-pair")
    with pytest.raises(RegistryError, match="unknown draft"):
        parse_registry({"default_pair": "x", "models": {}, "pairs": {"x": {"draft": "a", "target": "b"}}})


def test_mirror_assembles_verified_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPRINTER_EDGE_HOME", str(tmp_path))
    spec = load_registry().pair("default").draft
    parts = mirror_parts(spec)
    assert parts and len(parts) == 6
    path = ensure_model(spec, download=False, progress=False)
    assert path == tmp_path / "models" / spec.file
    assert path.stat().st_size == spec.size
    assert not list(tmp_path.rglob("*.partial"))
    # a second call trusts the recorded checksum instead of hashing 0.5 GB again
    assert ensure_model(spec, download=False, progress=False) == path


def test_mirror_with_wrong_checksum_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPRINTER_EDGE_HOME", str(tmp_path))
    spec = replace(load_registry().pair("default").draft, sha256="0" * 64)
    with pytest.raises(ChecksumError, match="sha256"):
        assemble_from_mirror(spec, mirror_parts(spec) or [], progress=False)
    assert not (tmp_path / "models" / spec.file).exists()
    assert not list(tmp_path.rglob("*.partial"))


# ----------------------------------------------------------------------------- hub stand-in
def _registry(tmp: Path, draft: Path, target: Path, *, bad_sha: bool = False) -> Path:
    def entry(name: str, path: Path) -> str:
        sha = "f" * 64 if bad_sha else sha256_file(path)
        return (f'[models."{name}"]\nrepo = "tests/tiny"\nfile = "{path.name}"\n'
                f'revision = "{REVISION}"\nsize = {path.stat().st_size}\nsha256 = "{sha}"\n'
                'license = "apache-2.0"\n')

    text = ('default_pair = "tiny"\n' + entry("tiny-draft", draft) + entry("tiny-target", target)
            + '[pairs."tiny"]\ndraft = "tiny-draft"\ntarget = "tiny-target"\ntokenizer = "smollm2"\n')
    path = tmp / "pairs.toml"
    path.write_text(text)
    return path


def _cli(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "sprinter_edge", *args], env={**os.environ, **env},
                          capture_output=True, text=True, timeout=300)


@pytest.fixture()
def hub_env(tmp_path: Path, fixture_target_path: Path, fixture_draft_path: Path):
    files = {fixture_draft_path.name: fixture_draft_path, fixture_target_path.name: fixture_target_path}
    with HubStandIn("tests/tiny", REVISION, files) as hub:
        env = {
            "HF_ENDPOINT": hub.endpoint, "HF_HOME": str(tmp_path / "hf"),
            "SPRINTER_EDGE_HOME": str(tmp_path / "home"), "HF_HUB_DISABLE_TELEMETRY": "1",
            "SPRINTER_EDGE_REGISTRY": str(_registry(tmp_path, fixture_draft_path, fixture_target_path)),
            "HF_HUB_DISABLE_XET": "1",
        }
        yield hub, env, tmp_path


def test_pull_downloads_and_verifies(hub_env) -> None:  # noqa: ANN001
    hub, env, tmp = hub_env
    r = _cli(["pull"], env)
    assert r.returncode == 0, r.stderr
    assert "sha256 ok" in r.stdout
    assert any(m == "GET" for m, _, _ in hub.requests)
    listed = json.loads(_cli(["models", "--json"], env).stdout)
    assert listed[0]["models"]["target"]["state"] == "hf-cache"
    # pulling again uses the cache: no new GET
    gets = sum(m == "GET" for m, _, _ in hub.requests)
    assert _cli(["pull", "--offline"], env).returncode == 0
    assert sum(m == "GET" for m, _, _ in hub.requests) == gets


def test_interrupted_download_cleans_up(hub_env) -> None:  # noqa: ANN001
    hub, env, tmp = hub_env
    hub.drop_after = 3_000_000  # every response breaks off, so the retries finally give up
    first = _cli(["pull"], env)
    assert first.returncode == 5, first.stderr
    assert "Traceback" not in first.stderr and "broke off" in first.stderr
    assert sum(m == "GET" for m, _, _ in hub.requests) > 1  # huggingface_hub retried first
    # nothing that looks complete is left behind (huggingface_hub drops its .incomplete file)
    assert not list((tmp / "hf").rglob("snapshots/*/*.gguf"))
    assert not [p for p in (tmp / "hf").rglob("blobs/*") if not p.name.endswith(".incomplete")]
    assert not list((tmp / "home").rglob("*.gguf"))
    hub.drop_after = None
    second = _cli(["pull"], env)
    assert second.returncode == 0, second.stderr
    assert second.stdout.count("sha256 ok") == 2


def test_checksum_mismatch_is_removed(hub_env, fixture_target_path: Path, fixture_draft_path: Path) -> None:  # noqa: ANN001
    hub, env, tmp = hub_env
    env = {**env, "SPRINTER_EDGE_REGISTRY": str(_registry(tmp, fixture_draft_path, fixture_target_path,
                                                           bad_sha=True))}
    r = _cli(["pull"], env)
    assert r.returncode == 3, r.stderr
    assert "sha256 mismatch" in r.stderr and "Traceback" not in r.stderr
    assert not [p for p in (tmp / "hf").rglob("*") if p.is_file() and p.suffix == ".gguf"]


def test_offline_and_unreachable_hub_give_clear_errors(hub_env) -> None:  # noqa: ANN001
    hub, env, tmp = hub_env
    r = _cli(["pull", "--offline"], env)
    assert r.returncode == 5 and "offline" in r.stderr and "Traceback" not in r.stderr
    r = _cli(["pull"], {**env, "HF_ENDPOINT": "http://127.0.0.1:9"})
    assert r.returncode == 5 and "Traceback" not in r.stderr, r.stderr


def test_missing_model_without_download(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPRINTER_EDGE_HOME", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    spec = load_registry().models["qwen2.5-coder-7b-instruct-q4_k_m"]
    from sprinter_edge.errors import ModelFileError

    with pytest.raises(ModelFileError, match="sprinter-edge pull"):
        ensure_model(spec, download=False, progress=False)


def test_models_cli_lists_pairs() -> None:
    r = _cli(["models"], {})
    assert r.returncode == 0
    assert "qwen2.5-coder-0.5b-1.5b (default)" in r.stdout
    shutil.which("sprinter-edge")  # the console script is installed alongside
