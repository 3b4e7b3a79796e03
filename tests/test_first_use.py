"""First use: a quick cost measurement that the decoder's own calls refine, a draft priced
without loading it until a plan needs it, and logit_bias as part of the target's distribution."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from support.clock import CallClock

from sprinter_edge import Engine, Hardware, SamplingParams
from sprinter_edge.costs.table import (
    BASE_DEPTH,
    DISAGREE,
    DISAGREE_CALLS,
    LEARN_BUCKET,
    LEARN_ENV,
    PLAN_SIZES,
    QUICK_FULL_SIZES,
    RESCALE_MAX,
    CostTable,
    _out_of_line,
    cost_file,
    machine_costs,
    prior_costs,
    read_costs,
    store_costs,
)
from sprinter_edge.decoding.proposers.base import Proposal
from sprinter_edge.decoding.sampling import Sampler
from sprinter_edge.errors import SettingsError


def flat(ms: float, sizes: tuple[int, ...] = (1, 2, 4, 8, 16, 32)) -> CostTable:
    return CostTable(last={n: ms for n in sizes}, full={n: ms * n for n in sizes})


def test_a_call_teaches_the_point_it_measured() -> None:
    table = flat(10.0)
    table.learn(1, 1, BASE_DEPTH, 14.0, count=3)  # three plain steps at 14 ms against 10 measured once
    assert table.last[1] == pytest.approx((10.0 + 3 * 14.0) / 4)
    assert table.weight["last:1"] == 4
    table.learn(12, 12, BASE_DEPTH, 100.0)  # an all-rows size the first measurement skipped
    assert table.full[12] == 100.0 and table.cost(12, 12) == 100.0
    before = table.to_dict()
    table.learn(8, 3, BASE_DEPTH, 500.0)  # some rows but not all: measures neither curve
    assert table.to_dict() == before


def test_a_table_timed_under_load_is_rescaled_by_the_first_reply_that_disagrees() -> None:
    table = flat(30.0)  # timed while something else used the CPU: 3x what calls now take
    seen = table.learn_calls([(1, 1, BASE_DEPTH, 10.0, 20), (16, 16, BASE_DEPTH, 160.0, 2)])
    assert seen == pytest.approx(1 / 3, rel=0.1)
    assert table.cost(1) == pytest.approx(10.0, rel=0.15)
    assert table.all_rows(16) == pytest.approx(160.0, rel=0.15)
    assert table.cost(8) == pytest.approx(10.0, rel=0.15)  # a size no call reached: rescaled too
    # noise on a quiet machine moves only the points it measured
    quiet = flat(10.0)
    assert quiet.learn_calls([(1, 1, BASE_DEPTH, 12.0, 20)]) == pytest.approx(1.2)
    assert quiet.cost(8) == 10.0
    # too few calls to tell
    assert flat(30.0).learn_calls([(1, 1, BASE_DEPTH, 10.0, 2)]) == 1.0
    # a deep call that is dearer may be the depth the table has not seen, not a wrong table
    deep = flat(10.0)
    deep.learn_calls([(1, 1, 2048, 10.0 * DISAGREE * 1.5, 20)])
    assert deep.cost(1) == 10.0 and deep.at(2048).cost(1) > 10.0 * DISAGREE
    # one that is cheaper says the table is too dear: a deeper context never costs less
    fast = flat(30.0)
    fast.learn_calls([(1, 1, 2048, 10.0, 20)])
    assert fast.cost(1) == pytest.approx(10.0, rel=0.05)
    # calls far cheaper than any load explains move the table at most RESCALE_MAX at once
    wild = flat(100.0)
    wild.learn_calls([(1, 1, BASE_DEPTH, 1.0, 20)])
    assert wild.cost(8) == pytest.approx(100.0 / RESCALE_MAX)


def test_a_call_out_of_line_with_its_neighbours_is_timed_again() -> None:
    assert _out_of_line({1: 10.0, 2: 12.0, 4: 40.0, 8: 20.0, 16: 18.0}) == [4]  # a peak
    assert _out_of_line({1: 10.0, 2: 12.0, 4: 13.0, 8: 20.0, 16: 18.0}) == []  # a dip is the kernel's


def test_deep_calls_scale_the_curve_at_their_depth() -> None:
    table = flat(10.0)
    assert table.at(2048).cost(1) == 10.0  # nothing known past the base depth yet
    table.learn(1, 1, 2048, 15.0, count=5)  # steps after 2k tokens: 1.5x
    table.learn(16, 16, 2048, 16 * 10.0 * 1.2, count=2)  # a 16-row check: 1.2x
    deep = table.at(2048)  # (priced at the middle of its 128-token step: within 3%)
    assert deep.cost(1) == pytest.approx(15.0, rel=0.03)
    assert deep.cost(8) == pytest.approx(15.0, rel=0.03)  # one row: the steps' ratio, every size
    assert deep.all_rows(16) == pytest.approx(192.0, rel=0.03)
    assert deep.all_rows(32) == pytest.approx(32 * 10.0 * 1.2, rel=0.03)  # all rows: the checks'
    # halfway between the base depth and the learned bucket: halfway in ratio
    mid = BASE_DEPTH + (2048 - BASE_DEPTH) // 2
    assert table.at(mid).cost(1) == pytest.approx(10.0 * (1 + 0.5 * (15.0 / 10.0 - 1)), rel=0.05)
    assert 2048 in table.deep and 2048 % LEARN_BUCKET == 0
    # a swept table keeps its measured depths: calls refine only its base
    swept = flat(10.0)
    swept.depths_measured = True
    swept.learn(1, 1, 2048, 15.0, count=5)
    assert not swept.deep


def test_a_learned_table_survives_the_cache(tmp_path: Path) -> None:
    table = flat(10.0)
    table.learn(1, 1, 3000, 20.0, count=4)
    again = CostTable.from_dict(json.loads(json.dumps(table.to_dict())))
    assert again.to_dict() == table.to_dict()
    assert again.at(3000).cost(1) == pytest.approx(table.at(3000).cost(1))


def test_an_unloaded_draft_is_priced_from_the_target_and_file_sizes(tmp_path: Path) -> None:
    target_file, draft_file = tmp_path / "t.gguf", tmp_path / "d.gguf"
    target_file.write_bytes(b"x" * 1000)
    draft_file.write_bytes(b"x" * 250)  # r = 0.25
    prior = prior_costs(flat(40.0), draft_file, target_file)
    assert prior.cost(1) == pytest.approx(40.0 * 0.5)  # a step: sqrt(r)
    assert prior.all_rows(16) == pytest.approx(16 * 40.0 * 0.25)  # a batch: r


def test_proposer_of_each_proposed_token() -> None:
    lookup = Proposal([1, 2, 3], [1, 2, 3], grammar=1, copied=2, proposer="lookup")
    assert [lookup.proposer_of(j) for j in range(3)] == ["grammar", "copy", "copy"]
    staged = Proposal([1, 2, 9], [1, 2, 9], copied=5, drafted=1, proposer="staged")  # offered 5, kept 2
    assert [staged.proposer_of(j) for j in range(3)] == ["copy", "copy", "draft"]
    sd = Proposal([4, 5], [4, 5], drafted=2, proposer="draft")
    assert [sd.proposer_of(j) for j in range(2)] == ["draft", "draft"]


def test_logit_bias_moves_the_greedy_choice_and_the_distribution() -> None:
    row = np.array([3.0, 2.0, 1.0, 0.0], np.float32)
    assert Sampler(SamplingParams()).prepare(row) == 0
    assert Sampler(SamplingParams(logit_bias={0: -100.0})).prepare(row) == 1
    p = Sampler(SamplingParams(temperature=1.0, logit_bias={3: 100.0})).prepare(row)
    assert isinstance(p, np.ndarray) and p[3] > 0.999
    with pytest.raises(SettingsError, match="between -100 and 100"):
        SamplingParams(logit_bias={1: 101.0})
    with pytest.raises(SettingsError, match="not a token id"):
        SamplingParams(logit_bias={-1: 1.0})


# ---------------------------------------------------------------------------- real models

@pytest.fixture
def fresh_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("SPRINTER_EDGE_CACHE", str(tmp_path))
    return tmp_path


@pytest.mark.slow
def test_first_use_measures_quickly_and_replies_refine_it(
        fresh_cache: Path, fixture_target_path: Path, fixture_draft_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(LEARN_ENV, "1")  # on for users; the suite's conftest turns it off
    engine = Engine(fixture_target_path, fixture_draft_path, method="auto",
                    hardware=Hardware(n_ctx=1024, n_threads=1))
    try:
        planner = engine.planner()
        table = planner.target
        # the quick measurement: one repeat of the plan sizes after BASE_DEPTH tokens, no sweep
        assert set(table.last) == set(PLAN_SIZES)
        assert set(QUICK_FULL_SIZES) <= set(table.full)
        assert not table.deep and not table.depths_measured
        # the draft was never loaded: priced from the target, not measured
        assert engine.models.loaded("draft") is None and planner.draft is not None
        stored = cost_file(engine.target)
        first = stored.read_text()
        prompt = "Repeat this list exactly: " + ", ".join(f"item {i}" for i in range(60))
        result = engine.generate(prompt, SamplingParams(max_tokens=48), method="auto")
        assert result.stats.baseline_seconds and result.stats.to_dict()["speedup_estimate"] > 0
        learned = read_costs(stored)
        assert stored.read_text() != first  # the reply's calls were folded in and stored
        assert learned.weight and max(learned.weight.values()) > 1 or learned.deep
    finally:
        engine.close()


@pytest.mark.slow
def test_a_stored_table_timed_under_load_is_corrected_by_the_replies(
        fresh_cache: Path, fixture_target_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A table 3x too dear in the cache (timed while something else used the CPU) is back at
    what the calls cost after one reply of plain steps, and stored so. The reply's clock charges
    each target call the quiet table's price for it, so what the calls cost is known, not timed."""
    monkeypatch.setenv(LEARN_ENV, "1")
    engine = Engine(fixture_target_path, method="lookup", hardware=Hardware(n_ctx=1024, n_threads=1))
    try:
        quiet = CostTable.from_dict(engine.planner().target.to_dict())
        busy = CostTable.from_dict(quiet.to_dict())
        busy.rescale(3.0)
        store_costs(engine.target, busy)
        engine.set_planner(None)
        # read back as stored
        assert engine.planner().target.cost(1) == pytest.approx(3 * quiet.cost(1), rel=0.01)
        clock = CallClock()
        clock.charge(monkeypatch, engine.target, "target",
                     lambda n, rows, depth: quiet.at(depth).cost(n, rows) / 1e3)
        gen = engine.stream("Write a short poem about rivers.", SamplingParams(max_tokens=32))
        gen.ctx.clock = clock
        assert gen.consume().stats.counters.target_calls >= DISAGREE_CALLS
        corrected = engine.planner().target.cost(1)
        assert corrected == pytest.approx(quiet.cost(1), rel=0.01)  # rescaled by 1/3, then agreed
        assert read_costs(cost_file(engine.target)).cost(1) == pytest.approx(corrected, rel=0.01)
    finally:
        engine.close()


@pytest.mark.slow
def test_logit_bias_is_exact_for_every_method(fixture_engine: Engine) -> None:
    """A bias that bans the greedy reply's first token: every exact method follows the biased
    target token for token; an id past the vocabulary is refused."""
    # Each method starts from an empty KV cache: a prompt prefix kept from another request was
    # computed in a batch of another size, and with flash attention on the test model that moves
    # a logit by up to ~0.3 ("Count from one to ten:" flipped a 0.003 near-tie that way). The
    # biased reply here has its top two logits at least 0.3 apart at every step.
    prompt = "List the days of the week:"
    plain = fixture_engine.generate(prompt, SamplingParams(max_tokens=12), method="ar")
    banned = plain.token_ids[0]
    params = SamplingParams(max_tokens=6, logit_bias={banned: -100.0})  # short: no near-tie luck

    def fresh(method: str) -> list[int]:
        fixture_engine.target.reset()
        return fixture_engine.generate(prompt, params, method=method).token_ids

    outputs = {m: fresh(m) for m in ("ar", "sd", "lookup")}
    assert outputs["ar"][0] != banned
    assert outputs["sd"] == outputs["ar"] and outputs["lookup"] == outputs["ar"]
    with pytest.raises(SettingsError, match="out of range"):
        fixture_engine.generate(prompt, SamplingParams(max_tokens=4, logit_bias={10**7: 1.0}))


@pytest.mark.slow
def test_machine_costs_sweeps_depths_only_when_asked(fresh_cache: Path, fixture_engine: Engine) -> None:
    quick = machine_costs(fixture_engine.target)
    assert not quick.depths_measured
    full = machine_costs(fixture_engine.target, depths=True)
    assert full.depths_measured and full.deep
    assert machine_costs(fixture_engine.target).depths_measured  # stored


def test_an_unloaded_draft_is_still_checked_up_front(fresh_cache: Path, fixture_target_path: Path,
                                                     tmp_path: Path) -> None:
    """Priced without loading it, a draft that is not a GGUF file is refused when the planner is
    built, not in the middle of the reply whose plan first loads it."""
    from sprinter_edge.errors import ModelFileError

    bad = tmp_path / "draft.gguf"
    bad.write_bytes(b"not a model at all")
    engine = Engine(fixture_target_path, bad, method="auto", hardware=Hardware(n_ctx=1024, n_threads=1))
    try:
        with pytest.raises(ModelFileError, match="not a GGUF file"):
            engine.planner()
    finally:
        engine.close()
