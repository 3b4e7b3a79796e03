"""The public Python API on the fixture pair: generate, stream, chat; the chat session."""

from __future__ import annotations

import inspect
import subprocess
import sys
from pathlib import Path

import pytest

import sprinter_edge
from sprinter_edge import Chunk, Engine, GenerationResult, Hardware, SamplingParams, Stats
from sprinter_edge.errors import ContextOverflowError
from sprinter_edge.serving.chat_session import ChatSession

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def engine(fixture_target_path: Path, fixture_draft_path: Path):
    """The fixture pair on one thread each (the shared test machine is busy)."""
    with Engine.from_files(fixture_target_path, draft=fixture_draft_path, method="sd", verifier="confidence",
                           hardware=Hardware(n_ctx=1024, n_threads=1)) as eng:
        yield eng.load()


def test_public_surface() -> None:
    for name in ("Engine", "Hardware", "Chunk", "Generation", "GenerationResult", "Stats",
                 "SamplingParams", "OperatingPoint", "SprinterError", "__version__"):
        assert hasattr(sprinter_edge, name)
    for fn in (Engine.generate, Engine.stream, Engine.chat, Engine.from_pair, Engine.from_files):
        sig = inspect.signature(fn)
        assert sig.return_annotation != inspect.Signature.empty, fn
    # every call takes its sampling settings as one SamplingParams, whose fields are explicit
    for fn in (Engine.generate, Engine.stream, Engine.chat):
        assert "params" in inspect.signature(fn).parameters, fn
    assert {"max_tokens", "temperature", "top_k", "top_p", "seed", "stop"} <= set(
        inspect.signature(SamplingParams).parameters)
    assert Hardware().n_ctx is None  # the model's trained context, up to AUTO_CTX (backend/llama.py)


@pytest.mark.parametrize("method", ["ar", "sd", "sprinter"])
def test_generate_returns_text_and_stats(engine: Engine, method: str) -> None:
    result = engine.generate("Name a fruit.", SamplingParams(max_tokens=6), method=method)
    assert isinstance(result, GenerationResult) and isinstance(result.stats, Stats)
    assert result.text and result.method == method
    assert 1 <= len(result.token_ids) <= 6 and result.finish_reason in ("stop", "length")
    assert result.stats.new_tokens >= len(result.token_ids) and result.stats.prompt_tokens > 0
    assert result.stats.to_dict()["method"] == method


def test_stream_chunks_join_to_final_text(engine: Engine) -> None:
    gen = engine.stream("Tell me about cats.", SamplingParams(max_tokens=8), method="sd")
    chunks = list(gen)
    assert chunks and all(isinstance(c, Chunk) for c in chunks)
    assert gen.result is not None
    assert "".join(c.text for c in chunks) == gen.result.text
    assert [t for c in chunks for t in c.token_ids] == gen.result.token_ids
    # greedy sd is lossless: same text as plain generation with the target
    ar = engine.generate("Tell me about cats.", SamplingParams(max_tokens=8), method="ar")
    assert ar.text == gen.result.text


def test_stream_close_cancels(engine: Engine) -> None:
    gen = engine.stream("Write a long story.", SamplingParams(max_tokens=200), method="ar")
    first = next(iter(gen))
    gen.close()
    assert first.token_ids and gen.result is not None
    assert gen.result.finish_reason == "cancelled" and len(gen.result.token_ids) < 200


def test_chat_messages(engine: Engine) -> None:
    messages = [{"role": "system", "content": "You are terse."},
                {"role": "user", "content": "Say hi."}]
    result = engine.chat(messages, SamplingParams(max_tokens=6), method="sd")
    assert result.text and result.stats.prompt_tokens == len(engine.encode(messages))


def test_chat_session_reuses_the_kv_cache(engine: Engine) -> None:
    engine.set_method("sd")
    session = ChatSession(engine, params=SamplingParams(max_tokens=6))
    result = session.reply("Hello there.")
    first = session.last_turn
    assert first is not None and not first.from_history
    previous = first.prompt_tokens + len(result.token_ids)
    for text in ("What is two plus two?", "And three plus three?"):
        result = session.reply(text)
        turn = session.last_turn
        assert turn is not None and turn.from_history
        # the previous prompt and reply are not read again (bar the reply's last token,
        # which was sampled but never decoded): only that and the new message are read
        assert turn.reused_tokens >= previous - 1
        assert turn.reread_tokens <= turn.prompt_tokens - previous + 1 < 25
        previous = turn.prompt_tokens + len(result.token_ids)
    assert [m["role"] for m in session.messages][-2:] == ["user", "assistant"]
    session.reset()
    assert session.messages == [] and session.last_result is None


def test_chat_session_overflow_leaves_history(engine: Engine) -> None:
    engine.set_method("ar")
    session = ChatSession(engine, params=SamplingParams(max_tokens=4))
    session.reply("Hi.")
    before = list(session.messages)
    with pytest.raises(ContextOverflowError):
        session.send("word " * 2000)
    assert session.messages == before
    assert session.reply("Bye.").text


def test_quickstart_example_help() -> None:
    out = subprocess.run([sys.executable, str(ROOT / "examples" / "quickstart.py"), "--help"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "max-tokens" in out.stdout


def test_a_model_gets_its_trained_context_by_default(fixture_target_path) -> None:
    """No n_ctx given: the model's trained context (8192 for the fixture), at most AUTO_CTX."""
    from sprinter_edge.backend.llama import AUTO_CTX, LlamaModel, LoadOptions

    model = LlamaModel(fixture_target_path, LoadOptions(n_threads=1))
    try:
        assert model.n_ctx == min(8192, AUTO_CTX)
    finally:
        model.close()
