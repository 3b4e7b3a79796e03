"""`serve` with the models found on this machine (serving/models.py): /v1/models lists them, a
request's `model` picks one (loaded on first use, its draft found for it), an unknown name gets
the default, and the reply's `model` says which ran; the engines loaded stay within memory."""

from __future__ import annotations

import os
from pathlib import Path

import httpx
import pytest
from support.local_stores import LMSTUDIO_NAME, Machine, build, point_at
from support.server import TIMEOUT, running_server

from sprinter_edge.catalog import local
from sprinter_edge.serving.models import Offer, ServedModels

DEFAULT = "ollama:smollm2:135m"
PROMPT = "The capital of France is"


# ---------------------------------------------------------------------------- memory, without models
class FakeEngine:
    closed: list[str] = []  # names, in the order they were closed

    def __init__(self, name: str):
        self.name, self.loads = name, 0

    def load(self) -> FakeEngine:
        self.loads += 1
        return self

    def close(self) -> None:
        FakeEngine.closed.append(self.name)


def _offers(tmp_path: Path, sizes: dict[str, int]) -> list[Offer]:
    out = []
    for name, size in sizes.items():
        (tmp_path / name).write_bytes(b"\0" * size)
        out.append(Offer(name, tmp_path / name))
    return out


def test_models_load_on_first_use_and_make_room(tmp_path: Path) -> None:
    FakeEngine.closed = []
    a, b, c = _offers(tmp_path, {"a": 1000, "b": 1000, "c": 4000})
    free = [3000]
    default = FakeEngine("a")
    models = ServedModels(a, default, [b, c], make=FakeEngine_of, memory=lambda: free[0])  # type: ignore[arg-type]
    assert models.ids() == ["a", "b", "c"]
    assert models.pick("b") == "b" and models.pick("gpt-4o") == "a" and models.pick(None) == "a"
    assert models.engine("a") is default
    engine_b = models.engine("b")  # fits beside a (1200 bytes needed, 3000 free): both stay
    assert engine_b.name == "b" and engine_b.loads == 1 and models.loaded() == ["a", "b"]
    assert models.engine("b") is engine_b and engine_b.loads == 1  # loaded once
    models.engine("a")  # a is the most recently used now
    free[0] = 1000  # c needs 4800: the others go, least recently used first
    assert models.engine("c").name == "c"
    assert FakeEngine.closed == ["b", "a"] and models.loaded() == ["c"]
    again = models.engine("a")  # the default, made afresh
    assert again is not default and again.loads == 1 and FakeEngine.closed == ["b", "a", "c"]


def FakeEngine_of(offer: Offer) -> FakeEngine:  # noqa: N802
    return FakeEngine(offer.id)


def test_unknown_memory_means_one_model_at_a_time(tmp_path: Path) -> None:
    FakeEngine.closed = []
    a, b = _offers(tmp_path, {"a": 10, "b": 10})
    models = ServedModels(a, FakeEngine("a"), [b], make=FakeEngine_of, memory=lambda: None)  # type: ignore[arg-type]
    models.engine("b")
    assert FakeEngine.closed == ["a"] and models.loaded() == ["b"]


def test_a_failed_load_is_tried_again_alone(tmp_path: Path) -> None:
    FakeEngine.closed = []
    a, b = _offers(tmp_path, {"a": 10, "b": 10})
    tries = []

    class Picky(FakeEngine):  # fails to load while another model is loaded (a full GPU)
        def load(self) -> FakeEngine:
            tries.append(list(models.loaded()))
            if models.loaded():
                raise RuntimeError("out of GPU memory")
            return super().load()

    models = ServedModels(a, FakeEngine("a"), [b], make=lambda o: Picky(o.id), memory=lambda: 1 << 40)  # type: ignore[arg-type]
    assert models.engine("b").loads == 1
    assert tries == [["a"], []] and FakeEngine.closed == ["b", "a"] and models.loaded() == ["b"]


def test_same_files_share_an_engine(tmp_path: Path) -> None:
    (a,) = _offers(tmp_path, {"a": 10})
    alias = Offer("ollama:a:latest", tmp_path / "a")
    default = FakeEngine("a")
    models = ServedModels(a, default, [alias], make=FakeEngine_of, memory=lambda: 1 << 40)  # type: ignore[arg-type]
    assert models.engine("ollama:a:latest") is default


# ---------------------------------------------------------------------------- a live server
@pytest.fixture(scope="module")
def machine(tmp_path_factory: pytest.TempPathFactory, fixture_target_path: Path,
            fixture_draft_path: Path) -> Machine:
    return build(tmp_path_factory.mktemp("served") / "home", fixture_target_path, fixture_draft_path)


def _reference(path: Path, max_tokens: int) -> str:
    """What the model at `path` writes after PROMPT, greedy, in this process."""
    from sprinter_edge import Engine, Hardware, SamplingParams

    with Engine(path, method="ar", hardware=Hardware(n_ctx=512, n_threads=1)) as engine:
        return engine.generate(PROMPT, SamplingParams(max_tokens=max_tokens), chat=False).text


@pytest.mark.slow
def test_a_request_names_the_model_that_answers(machine: Machine, tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch,
                                                fixture_target_path: Path, fixture_draft_path: Path) -> None:
    before = machine.files()
    point_at(machine, monkeypatch)
    found = local.find_models()
    expected = {DEFAULT} | {m.name for m in found.usable()
                            if not m.same_file(machine.names[DEFAULT])}
    args = ["--target", DEFAULT, "--method", "ar", "--threads", "1", "--ctx", "512", "--max-tokens", "6"]
    with running_server(args, tmp_path / "server.log") as base:
        listed = httpx.get(f"{base}/v1/models", timeout=TIMEOUT).json()["data"]
        assert [m["id"] for m in listed][0] == DEFAULT
        assert {m["id"] for m in listed} == expected  # every usable model found, the broken left out
        assert {m["id"]: m["owned_by"] for m in listed}[LMSTUDIO_NAME] == "lmstudio"

        def complete(model: str) -> dict:
            r = httpx.post(f"{base}/v1/completions", timeout=TIMEOUT,
                           json={"model": model, "prompt": PROMPT, "max_tokens": 6, "temperature": 0})
            assert r.status_code == 200, r.text
            return r.json()

        second = complete(LMSTUDIO_NAME)  # loaded now: the fixture draft, as a model of its own
        first = complete(DEFAULT)
        unknown = complete("gpt-4o")
        assert second["model"] == LMSTUDIO_NAME and first["model"] == DEFAULT
        assert unknown["model"] == DEFAULT  # as llama.cpp's server: the default answers
        texts = [r["choices"][0]["text"] for r in (first, second, unknown)]
        chat = httpx.post(f"{base}/v1/chat/completions", timeout=TIMEOUT,
                          json={"model": LMSTUDIO_NAME, "max_tokens": 3, "stream": True,
                                "messages": [{"role": "user", "content": "hi"}]})
        assert chat.status_code == 200 and f'"model":"{LMSTUDIO_NAME}"' in chat.text.replace(" ", "")
        health = httpx.get(f"{base}/health", timeout=TIMEOUT).json()
        assert set(health["models_loaded"]) == {DEFAULT, LMSTUDIO_NAME}  # this machine has the room
    assert texts[0] == texts[2] == _reference(fixture_target_path, 6)
    assert texts[1] == _reference(fixture_draft_path, 6)
    assert texts[0] != texts[1]
    assert machine.files() == before  # no store file changed
    assert os.access(machine.ollama, os.R_OK)


def test_models_limits_the_offer(machine: Machine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    point_at(machine, monkeypatch)
    args = ["--target", DEFAULT, "--method", "ar", "--threads", "1", "--ctx", "512", "--models", "lmstudio:*"]
    with running_server(args, tmp_path / "server.log") as base:
        listed = [m["id"] for m in httpx.get(f"{base}/v1/models", timeout=TIMEOUT).json()["data"]]
    assert listed == [DEFAULT, LMSTUDIO_NAME]
