"""`auto` loads the draft only when a plan drafts: a one-model plan (ar, lookup) never pays for
its load, and the planner prices draft plans from the draft's cached cost table."""

from __future__ import annotations

from pathlib import Path

import pytest
from scripted_planner import Scripted

from sprinter_edge import Engine, Hardware, SamplingParams
from sprinter_edge.decoding import Plan
from sprinter_edge.decoding.sd import Speculative
from sprinter_edge.errors import TokenizerMismatchError

pytestmark = pytest.mark.integration

EDIT = ("Rename the function `merge_configs` to `combine_configs` everywhere. Return the whole code "
        "in one python code block.\n\n```python\ndef merge_configs(base, override):\n"
        "    merged = dict(base)\n    for key, value in override.items():\n"
        "        if value is not None:\n            merged[key] = value\n    return merged\n```")
HARDWARE = Hardware(n_ctx=2048, n_threads=2)


@pytest.fixture(scope="module")
def pair(default_pair_paths: tuple[Path, Path]) -> tuple[Path, Path]:
    mp = pytest.MonkeyPatch()
    mp.setenv("SPRINTER_EDGE_EXTRA_BUFFERS", "0")  # batch-invariant kernels: sd is ar token for token
    draft, target = default_pair_paths
    # an explicit load loads both and records the draft's cost table for load-free pricing
    with Engine(target, draft, hardware=HARDWARE) as engine:
        engine.load()
        assert engine.models.loaded("draft") is not None
    yield draft, target
    mp.undo()


def test_auto_on_an_edit_that_runs_lookup_never_loads_the_draft(pair: tuple[Path, Path]) -> None:
    draft, target = pair
    with Engine(target, draft, hardware=HARDWARE) as engine:
        # a drafting plan, unmeasured, is never switched to mid-reply while its draft is behind;
        # 48 tokens: the copy must have held ~10 tokens before its proposals pay on a CPU where a
        # call of 2-8 rows costs about as many steps (a 2-core Zen 4 proposed nothing in 15)
        result = engine.generate(EDIT, SamplingParams(max_tokens=48))
        assert result.stats.trace.plans_run == ["lookup"]
        assert engine.models.loaded("draft") is None
        assert engine.planner().draft is not None  # draft plans were priced all the same
        assert result.stats.counters.copied_accepted > 0


def test_a_plan_that_drafts_loads_the_draft_and_stays_exact(pair: tuple[Path, Path]) -> None:
    draft, target = pair
    prompt = "Write a Python function that checks whether a number is prime."
    with Engine(target, draft, hardware=HARDWARE) as engine:
        params = SamplingParams(max_tokens=48)
        ar = engine.generate(prompt, params, method="ar")
        assert engine.models.loaded("draft") is None
        # ar first, then sd from the first look on: the draft loads mid-reply
        script = [Plan("ar", 100.0), Speculative().plan(1.0, draft_len=3)]
        engine.set_planner(Scripted(engine.planner(), script))
        auto = engine.generate(prompt, params)
        assert engine.models.loaded("draft") is not None
        assert auto.stats.trace.plans_run[:2] == ["ar", "sd(k=3)"], auto.stats.trace.plans_run
        assert auto.stats.counters.draft_calls > 0
        assert auto.token_ids == ar.token_ids


def test_a_draft_of_another_tokenizer_is_refused_before_it_drafts(
        pair: tuple[Path, Path], fixture_target_path: Path) -> None:
    """The mismatch is found from the recorded tokenizer, before any request decodes."""
    draft, target = pair
    with Engine(fixture_target_path, draft, hardware=HARDWARE) as engine, \
            pytest.raises(TokenizerMismatchError, match="do not share a tokenizer"):
        engine.generate("Hello", SamplingParams(max_tokens=4))
