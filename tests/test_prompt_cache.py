"""The prompt cache: KV states of earlier prompts kept across requests and conversations,
restored exactly, evicted least recently used within a byte budget."""

from __future__ import annotations

import inspect
import json
import textwrap
from pathlib import Path

import numpy as np
import pytest

from sprinter_edge import Engine, Hardware, SamplingParams
from sprinter_edge.backend.llama import LlamaModel, LoadOptions
from sprinter_edge.backend.prompt_cache import MIN_GAIN, PromptCache
from sprinter_edge.errors import SettingsError
from sprinter_edge.serving.chat_session import ChatSession


def words(seed: int, n: int) -> str:
    rng = np.random.default_rng(seed)
    vocab = ["alpha", "beta", "gamma", "delta", "river", "stone", "cloud", "paper", "window",
             "garden", "signal", "metal"]
    return " ".join(rng.choice(vocab, n))


@pytest.fixture(scope="module")
def model(fixture_target_path: Path):
    with LlamaModel(fixture_target_path, LoadOptions(n_ctx=1024, n_threads=1)) as m:
        yield m


@pytest.mark.slow
def test_a_restored_state_gives_the_logits_the_live_cache_gives(model: LlamaModel) -> None:
    a = model.tokenize(words(1, 200))
    b = model.tokenize(words(2, 200))
    cache = PromptCache.of_mib(64)
    model.reset()
    model.sync(a, n_logits=0)
    assert cache.prepare(model, b) == 0 and cache.stats.saved == 1  # a is kept as b evicts it
    model.sync(b, n_logits=0)
    follow = a + model.tokenize(" and then", add_special=False)
    assert cache.prepare(model, follow[:-1]) == len(a)  # a comes back: b is kept in turn
    assert model.tokens == a and cache.stats.saved == 2 and cache.stats.restored == 1
    before = model.decoded_tokens
    warm = model.sync(follow, n_logits=1).logits
    assert model.decoded_tokens - before == len(follow) - len(a)
    model.reset()  # the same reads with nothing in between: the same batches, the same rows
    model.sync(a, n_logits=0)
    live = model.sync(follow, n_logits=1).logits
    assert np.array_equal(warm, live)


def test_a_restore_must_beat_the_live_cache_by_a_margin(model: LlamaModel) -> None:
    a = model.tokenize(words(3, 200))
    cache = PromptCache.of_mib(64)
    model.reset()
    model.sync(a, n_logits=0)
    short = a[:MIN_GAIN // 2]
    assert cache.prepare(model, short + [1, 2, 3]) == len(short)  # kept a, restores nothing
    model.sync(short + [1, 2, 3], n_logits=0)
    # a shares only the live prefix and a few tokens more with this prompt: not worth a restore
    prompt = a[:len(short) + 8] + [4, 5]
    assert cache.prepare(model, prompt) == len(short)
    assert cache.stats.restored == 0


@pytest.mark.slow
def test_states_are_evicted_least_recently_used_within_the_budget(model: LlamaModel) -> None:
    prompts = [model.tokenize(words(10 + i, 150)) for i in range(3)]
    model.reset()
    model.sync(prompts[0], n_logits=0)
    size = len(model.save_state() or b"")
    cache = PromptCache(budget_bytes=int(size * 1.5))
    for p in prompts[1:]:
        cache.prepare(model, p)
        model.sync(p, n_logits=0)
    assert len(cache) == 1 and cache.stats.evicted == 1 and cache.used_bytes <= cache.budget_bytes
    assert cache.reusable(model, prompts[0]) < MIN_GAIN  # the first was evicted
    assert cache.reusable(model, prompts[1]) == len(prompts[1])  # the second was kept


def test_a_negative_budget_is_refused(fixture_target_path: Path) -> None:
    with pytest.raises(SettingsError, match="prompt_cache_mib"):
        Engine(fixture_target_path, None, method="ar", prompt_cache_mib=-1)


@pytest.mark.integration
def test_a_follow_up_after_another_conversation_reads_only_its_new_tokens(
        default_pair_paths: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    """Conversation A (a ~600-token prompt), conversation B, then A's follow-up: the follow-up
    reads only its new tokens, and its reply is the one a cold cache gives."""
    monkeypatch.setenv("SPRINTER_EDGE_EXTRA_BUFFERS", "0")  # batch-invariant: cold == warm
    draft, target = default_pair_paths
    code = textwrap.dedent(inspect.getsource(json.JSONEncoder.encode) + inspect.getsource(json.dumps))
    params = SamplingParams(max_tokens=24)
    with Engine(target, draft, method="ar", hardware=Hardware(n_ctx=2048, n_threads=2),
                prompt_cache_mib=512) as engine:
        a = ChatSession(engine, params=params)
        b = ChatSession(engine, params=params)
        a.reply(f"Explain what this code does.\n\n```python\n{code}```")
        assert a.last_turn is not None and 500 <= a.last_turn.prompt_tokens <= 1200
        b.reply("Write a haiku about the sea.")
        kept = len(a._prompt_tokens) + len(a._reply_tokens)  # A's first prompt and reply
        before = engine.target.decoded_tokens
        warm = a.reply("Now list the parameters of `dumps` that it passes on.")
        turn = a.last_turn
        assert turn is not None and turn.reused_tokens >= kept - 1
        # only the new tokens, then one decode per generated token after the first
        read = engine.target.decoded_tokens - before
        assert read <= turn.prompt_tokens - kept + params.max_tokens + 1, (read, turn)
        assert engine.prompt_cache is not None and engine.prompt_cache.stats.restored == 1
        tokens = a._prompt_tokens
        engine.reset_caches()
        assert len(engine.prompt_cache) == 0 and engine.target.tokens == []
        cold = engine.generate(tokens, params)
        assert warm.token_ids == cold.token_ids

