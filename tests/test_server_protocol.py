"""What clients depend on, through `sprinter-edge serve` on the fixture pair (a live subprocess,
the official `openai` client and raw httpx): `logit_bias` honoured exactly, a second request
sharing a prefix reads only its new tokens, a prediction under `auto` copied, and a stream
cancelled under a speculative method frees the server."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from support.server import TIMEOUT, fixture_server_args, leave_stream, running_server

from sprinter_edge import Engine
from sprinter_edge.costs import CostTable
from sprinter_edge.costs.table import store_costs
from sprinter_edge.decoding import SamplingParams


def fixed(ms: float) -> CostTable:
    """A machine where a decode call costs `ms` whatever its size, so a copy always pays."""
    sizes = range(1, 33)
    return CostTable(last=dict.fromkeys(sizes, ms), full=dict.fromkeys(sizes, ms))


@pytest.fixture(scope="module")
def server(fixture_target_path: Path, fixture_draft_path: Path, fixture_engine: Engine,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The server on the fixture pair, pricing its plans from fixed cost tables rather than
    from this (shared, busy) machine's timings: what `auto` chooses does not depend on the
    load. The tables are stored under the keys of the in-process engine's models, loaded with
    the server's options, in a cost folder of the server's own."""
    costs = tmp_path_factory.mktemp("costs")
    log = tmp_path_factory.mktemp("serve") / "server.log"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SPRINTER_EDGE_CACHE", str(costs))
        store_costs(fixture_engine.target, fixed(10.0))
        store_costs(fixture_engine.draft, fixed(2.0))
        stored = {p: p.read_bytes() for p in costs.rglob("*.json")}
        assert len(stored) == 4  # two tables, and the file aliases the server finds them by
        with running_server(fixture_server_args(fixture_target_path, fixture_draft_path, 16),
                            log) as base:
            mp.undo()
            yield base
    # the server priced with these tables: it timed nothing and stored nothing of its own
    assert {p: p.read_bytes() for p in costs.rglob("*.json")} == stored


@pytest.fixture(scope="module")
def client(server: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server}/v1", api_key="unused", max_retries=0, timeout=TIMEOUT)


def health(server: str) -> dict[str, Any]:
    return httpx.get(f"{server}/health", timeout=TIMEOUT).json()


def pieces(engine: Engine, tokens: list[int]) -> list[str]:
    """Each token's text as the server's logprobs name it."""
    return [engine.text_model.token_bytes(t).decode("utf-8", errors="replace") for t in tokens]


# ---------------------------------------------------------------------------- logit_bias

BIAS_PROMPT = "The capital of France is"


def in_process(engine: Engine, prompt: str, bias: dict[int, float], max_tokens: int) -> list[int]:
    """The in-process engine's greedy `ar` reply from an empty KV cache (the reference)."""
    engine.target.reset()
    params = SamplingParams(max_tokens=max_tokens, logit_bias=bias)
    return engine.generate(prompt, params, chat=False, method="ar").token_ids


def served(client: openai.OpenAI, prompt: str, bias: dict[int, float], max_tokens: int,
           method: str) -> list[str]:
    """The server's greedy reply to a completions request, token by token (from its logprobs)."""
    r = client.completions.create(model="fixture", prompt=prompt, max_tokens=max_tokens, logprobs=1,
                                  logit_bias={str(t): b for t, b in bias.items()},
                                  extra_body={"method": method})
    tokens = r.choices[0].logprobs.tokens
    assert "".join(tokens) == r.choices[0].text and len(tokens) == r.usage.completion_tokens
    return tokens


@pytest.mark.parametrize("method", ["ar", "sd"])
def test_logit_bias_is_honoured_exactly(client: openai.OpenAI, fixture_engine: Engine,
                                        method: str) -> None:
    """-100 on the token greedy decoding writes first: it never appears; +100 on another token:
    the reply opens with it; either way the served reply is, token for token, the in-process
    engine's with the same bias (sd applies the bias to the draft's rows too, and stays exact)."""
    plain = in_process(fixture_engine, BIAS_PROMPT, {}, 8)
    assert served(client, BIAS_PROMPT, {}, 8, method) == pieces(fixture_engine, plain)

    banned = plain[0]
    want = in_process(fixture_engine, BIAS_PROMPT, {banned: -100.0}, 8)
    assert banned not in want and want != plain
    got = served(client, BIAS_PROMPT, {banned: -100.0}, 8, method)
    assert got == pieces(fixture_engine, want)
    assert pieces(fixture_engine, [banned])[0] not in got

    (favoured,) = fixture_engine.text_model.tokenize(" London", add_special=False)
    assert favoured not in plain[:1]
    want = in_process(fixture_engine, BIAS_PROMPT, {favoured: 100.0}, 4)
    assert want[0] == favoured
    got = served(client, BIAS_PROMPT, {favoured: 100.0}, 4, method)
    assert got == pieces(fixture_engine, want) and got[0] == " London"


def test_logit_bias_on_the_chat_endpoint(client: openai.OpenAI, fixture_engine: Engine) -> None:
    """The chat endpoint takes the same field: the token the plain reply opens with is banned,
    and the reply is the in-process engine's with that bias, byte for byte; an id past the
    vocabulary is a 400."""
    messages = [{"role": "user", "content": "What is the capital of France?"}]

    def reference(bias: dict[int, float]) -> list[int]:
        fixture_engine.target.reset()
        return fixture_engine.generate(messages, SamplingParams(max_tokens=6, logit_bias=bias),
                                       method="ar").token_ids

    plain = reference({})
    want = reference({plain[0]: -100.0})
    assert plain[0] not in want
    r = client.chat.completions.create(model="fixture", messages=messages, max_tokens=6, logprobs=True,
                                       logit_bias={str(plain[0]): -100}, extra_body={"method": "sd"})
    assert [bytes(t.bytes) for t in r.choices[0].logprobs.content] == [
        fixture_engine.text_model.token_bytes(t) for t in want]
    bad = httpx.post(f"{client.base_url}chat/completions", timeout=TIMEOUT, json={
        "messages": messages, "max_tokens": 2, "logit_bias": {"10000000": -100}})
    assert bad.status_code == 400 and "out of range" in bad.json()["error"]["message"]


# ---------------------------------------------------------------------------- the prompt cache

def numbered_facts(seed: str, n: int = 12) -> str:
    """A long prefix no other test sends (an agent's system prompt and file, say)."""
    return "".join(f"Fact {i} about {seed}: the value is {(i * 7919) % 1000}.\n" for i in range(n))


def ask(client: openai.OpenAI, tokens: list[int]) -> Any:
    r = client.completions.create(model="fixture", prompt=tokens, max_tokens=4,
                                  extra_body={"method": "sd"})
    assert r.usage.prompt_tokens == len(tokens)
    return r.usage


def test_second_request_sharing_a_prefix_reads_only_its_new_tokens(
        client: openai.OpenAI, server: str, fixture_engine: Engine) -> None:
    """Two requests with a long shared prefix: the second reports that prefix as cached, reads
    only the rest, and /health's count of tokens read (measured from the target's decoded
    tokens, independently of the usage) agrees."""
    prefix = fixture_engine.encode(numbered_facts("rivers"), chat=False)
    q1 = fixture_engine.text_model.tokenize("Question: which fact is largest?", add_special=False)
    q2 = fixture_engine.text_model.tokenize("Tell me the value of fact 12.", add_special=False)
    assert len(prefix) > 150 and q1[0] != q2[0]

    first = ask(client, prefix + q1)
    assert first.prompt_tokens_details.cached_tokens < 10  # nothing of it was read before
    before = health(server)["totals"]
    second = ask(client, prefix + q2)
    after = health(server)["totals"]
    assert second.prompt_tokens_details.cached_tokens == len(prefix)
    new = second.prompt_tokens - second.prompt_tokens_details.cached_tokens
    assert new == len(q2)
    # /health counts what the prompt's read took; its last token is read with the first step
    assert after["prompt_tokens_read"] - before["prompt_tokens_read"] == new - 1
    assert after["prompt_tokens"] - before["prompt_tokens"] == second.prompt_tokens


@pytest.mark.slow
def test_prompt_cache_keeps_a_prefix_across_another_conversation(
        client: openai.OpenAI, server: str, fixture_engine: Engine) -> None:
    """A request from another conversation in between overwrites the KV cache; the prompt
    cache (`--cache-ram`, on by default) restores the first conversation's prefix, so its next
    request still reads only its new tokens."""
    prefix = fixture_engine.encode(numbered_facts("mountains"), chat=False)
    other = fixture_engine.encode(numbered_facts("oceans"), chat=False)
    q1 = fixture_engine.text_model.tokenize("Question: which fact is largest?", add_special=False)
    q2 = fixture_engine.text_model.tokenize("Tell me the value of fact 12.", add_special=False)
    ask(client, prefix + q1)
    interloper = ask(client, other + q1)
    assert interloper.prompt_tokens_details.cached_tokens < len(other) // 2
    before = health(server)["totals"]
    back = ask(client, prefix + q2)
    after = health(server)["totals"]
    assert back.prompt_tokens_details.cached_tokens == len(prefix)
    assert after["prompt_tokens_read"] - before["prompt_tokens_read"] == len(q2) - 1


def test_cached_tokens_in_a_stream_and_on_chat(client: openai.OpenAI) -> None:
    """The streamed usage carries the same field; a chat request repeated reads one token."""
    messages = [{"role": "user", "content": numbered_facts("lakes") + "Which fact is largest?"}]
    r1 = client.chat.completions.create(model="fixture", messages=messages, max_tokens=3)
    stream = client.chat.completions.create(model="fixture", messages=messages, max_tokens=3,
                                            stream=True, stream_options={"include_usage": True})
    usage = [ev.usage for ev in stream if ev.usage is not None][-1]
    assert usage.prompt_tokens == r1.usage.prompt_tokens
    # the same prompt again: all of it but its last token is in the KV cache
    assert usage.prompt_tokens_details.cached_tokens == usage.prompt_tokens - 1


# ---------------------------------------------------------------------------- prediction, auto

def test_prediction_under_auto_is_copied(client: openai.OpenAI) -> None:
    """The greedy reply sent back as the prediction, under `auto`: the reply is unchanged (a
    request with a prediction is planned as an edit, exactly), the usage counts the prediction
    as accepted, and the decoding counters show it was copied: most tokens accepted from the
    copy, in a handful of target calls. The prompt does not hold the reply, and without the
    prediction nothing is copied: the copy came from the prediction."""
    messages = [{"role": "user", "content": "Write a Python function that checks whether a number is even."}]
    n = 27
    plain = client.chat.completions.create(model="fixture", messages=messages, max_tokens=n,
                                           logprobs=True, top_logprobs=2, extra_body={"method": "ar"})
    text = plain.choices[0].message.content
    assert plain.usage.completion_tokens == n and "def is_even(" in text, text
    # no near-tie in the reply: a copy verified in one batch scores it as plain steps do
    gaps = [t.top_logprobs[0].logprob - t.top_logprobs[1].logprob for t in plain.choices[0].logprobs.content]
    assert min(gaps) > 0.3, gaps
    alone = client.chat.completions.create(model="fixture", messages=messages, max_tokens=n,
                                           extra_body={"method": "auto"})
    assert alone.choices[0].message.content == text and alone.usage.completion_tokens_details is None
    r = client.chat.completions.create(model="fixture", messages=messages, max_tokens=n,
                                       prediction={"type": "content", "content": text},
                                       extra_body={"method": "auto"})
    assert r.choices[0].message.content == text and r.usage.completion_tokens == n
    details = r.usage.completion_tokens_details
    assert details.accepted_prediction_tokens >= 0.9 * n and details.rejected_prediction_tokens <= 0.1 * n
    decoding, before = r.model_extra["decoding"], alone.model_extra["decoding"]
    assert decoding["method"] == "auto" and decoding["kind"] == "edit" and decoding["exact"] is True
    assert decoding["copied_accepted"] >= 0.75 * n, decoding
    assert decoding["target_calls"] <= n // 4, decoding
    # without the prediction auto copies only what its reply memory holds (the ar reply
    # above, after a probe of the copy): fewer tokens, in more target calls
    assert before["copied_accepted"] < decoding["copied_accepted"], before
    assert before["target_calls"] > decoding["target_calls"], before
    assert decoding["accepted_prediction_tokens"] == details.accepted_prediction_tokens


# ---------------------------------------------------------------------------- cancelled streams

@pytest.mark.parametrize("method", ["lookup", "sd"])
def test_cancelled_stream_frees_the_server(client: openai.OpenAI, server: str, method: str) -> None:
    """The client closes a long stream after three chunks: the worker stops that reply (it is
    counted cancelled, with far fewer tokens than it was allowed) and the next request is
    answered, with plain decoding's reply."""
    probe = "def add(a, b):\n    return"
    reference = client.completions.create(model="fixture", prompt=probe, max_tokens=4, logprobs=2,
                                          extra_body={"method": "ar"})
    # no near-tie in it: the same reply whatever the KV cache held before
    tops = [sorted(top.values(), reverse=True) for top in reference.choices[0].logprobs.top_logprobs]
    assert min(t[0] - t[1] for t in tops) > 0.3, tops
    start = health(server)
    body = {"model": "fixture", "prompt": "Once upon a time", "max_tokens": 900, "stream": True,
            "method": method}
    leave_stream(server, body, 3)
    deadline = time.monotonic() + TIMEOUT  # a bound on a hang, not on speed
    while True:
        now = health(server)
        if now["cancelled"] > start["cancelled"] and not now["busy"]:
            break
        assert time.monotonic() < deadline, now
        time.sleep(0.1)
    assert now["cancelled"] == start["cancelled"] + 1 and now["failed"] == start["failed"]
    assert now["completed"] == start["completed"]  # the stream was not run to its end
    assert now["totals"]["completion_tokens"] - start["totals"]["completion_tokens"] < 900
    again = client.completions.create(model="fixture", prompt=probe, max_tokens=4,
                                      extra_body={"method": method})
    assert again.choices[0].text == reference.choices[0].text
    assert reference.choices[0].text.startswith(" a + b")
    assert again.model_extra["decoding"]["method"] == method
