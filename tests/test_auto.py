"""`auto`: the planner's choices from cost tables, and the strategy on the fixture pair.

Planner tests use synthetic cost tables (what a GPU, a compute-bound CPU or a useless draft
look like); engine tests run real decodes and check that switching plans mid-reply keeps
the output exact (the fixture's kernels are batch-invariant, so greedy sd == ar exactly).
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
from scripted_planner import Scripted

from sprinter_edge import Engine, Hardware, SamplingParams
from sprinter_edge.costs.table import CostTable, machine_costs
from sprinter_edge.decoding.sd import ACCEPT, Speculative
from sprinter_edge.decoding.sprinter import FLAG_RATE, FLAGGED_ACCEPT, PRIORS
from sprinter_edge.planning.auto import Auto
from sprinter_edge.planning.planner import Plan, Planner, strategy_of
from sprinter_edge.verifiers.operating_point import OperatingPoint

SIZES = (1, 2, 4, 8, 16, 24, 32)


def table(single_ms: float, batch_factor: float) -> CostTable:
    """c(n) = single * (1 + batch_factor * (n - 1)); all-rows calls cost 10% more."""
    last = {n: single_ms * (1 + batch_factor * (n - 1)) for n in SIZES}
    return CostTable(last=last, full={n: v * (1.1 if n > 1 else 1.0) for n, v in last.items()})


COPY_PLANS = ("ar", "lookup")  # what remains when no draft plan pays: both exact, one model


def test_flat_batches_and_a_cheap_draft_pick_speculation() -> None:
    # GPU-like: a batch costs about one token; the draft is 5x cheaper than the target
    planner = Planner.of(table(30, 0.02), table(6, 0.02))
    plan, why = planner.best()
    assert plan.method == "sd" and "x ar" in why  # exact by default
    ar = next(p for p in planner.plans() if p.method == "ar")
    assert plan.ms_per_token < 0.7 * ar.ms_per_token
    approx, _ = planner.best(approximate=True)  # the caller chose an operating point
    assert approx.method in ("sd", "sprinter") and approx.ms_per_token <= plan.ms_per_token


def test_a_short_reply_after_a_long_prompt_does_not_wait_for_the_draft() -> None:
    """A draft plan that is fastest per token still starts only when its gain over the reply
    can pay for the draft reading the prompt; else the reply opens with a one-model plan."""
    planner = Planner.of(table(30, 0.02), table(6, 0.02))  # sd is the best plan per token
    assert planner.best()[0].method == "sd"
    long_reply, _ = planner.opening("chat", False, 2000, reply_tokens=2000, draft_behind=2000)
    assert long_reply.method == "sd"
    short, why = planner.opening("chat", False, 2000, reply_tokens=8, draft_behind=2000)
    assert not strategy_of(short).uses_draft and "read the prompt" in why
    read, _ = planner.opening("chat", False, 2000, reply_tokens=8, draft_behind=0)
    assert read.method == "sd"  # the draft holds the prompt already: nothing to pay back


def test_sprinter_is_a_candidate_only_when_approximation_is_allowed() -> None:
    planner = Planner.of(table(30, 0.02), table(6, 0.02))
    assert not [p for p in planner.plans() if p.method == "sprinter"]
    assert [p for p in planner.plans(approximate=True) if p.method == "sprinter"]
    assert all(strategy_of(p).exact for p in planner.plans())


def test_compute_bound_batches_pick_no_draft_plan() -> None:
    # every extra token in a batch costs a full step: verifying draft tokens never pays
    planner = Planner.of(table(30, 1.0), table(10, 1.0))
    plan, _ = planner.best()
    assert plan.method in COPY_PLANS
    sd = min(p.ms_per_token for p in planner.plans() if p.method == "sd")
    assert sd > planner.raw_ms("ar")


def test_a_draft_as_slow_as_the_target_picks_no_draft_plan() -> None:
    planner = Planner.of(table(30, 0.2), table(30, 0.2))
    assert planner.best()[0].method in COPY_PLANS


def test_no_draft_means_ar_or_lookup() -> None:
    planner = Planner.of(table(30, 0.02), None)
    assert {p.method for p in planner.plans(approximate=True)} == set(COPY_PLANS)
    assert planner.best()[0].method in COPY_PLANS


def test_measured_slowness_moves_the_choice_away() -> None:
    planner = Planner.of(table(30, 0.05), table(6, 0.05))
    first, _ = planner.best()
    assert first.method == "sd"
    # it ran 3x slower than predicted (threads fighting, say): the planner believes the clock
    planner.observe_time(first, 200, 3 * planner.raw_ms(first) * 200 / 1e3)
    assert planner.best()[0].method in COPY_PLANS


def test_acceptance_evidence_changes_the_prediction() -> None:
    planner = Planner.of(table(30, 0.1), table(6, 0.1), allow_approximate=False)
    before = planner.raw_ms("sd", draft_len=4)
    planner.evidence.rate(ACCEPT, 0.75).add_counts(10, 290)  # the draft is almost always wrong here
    assert planner.raw_ms("sd", draft_len=4) > before
    assert planner.best()[0].method in COPY_PLANS


def test_run_cap_bounds_the_candidates() -> None:
    planner = Planner.of(table(30, 0.02), table(6, 0.02), settings={"run_cap": 8})
    caps = {p.get("run_cap") for p in planner.plans(approximate=True) if p.method == "sprinter"}
    assert caps and max(caps) == 8


def test_evidence_is_kept_per_kind_and_close_plans_are_probed() -> None:
    planner = Planner.of(table(30, 1.0), table(10, 1.0))  # no draft plan pays
    first, _ = planner.best("edit")
    assert first.method == "lookup"  # its prior: a plain step plus proposals that pay
    planner.observe_time(first, 100, 100 * 0.4 * 30 / 1e3, "edit")  # measured: 0.4x ar's time
    assert planner.best("edit")[0].method == "lookup"  # nothing else is predicted within 15%
    planner.observe_time(first, 400, 400 * 0.95 * 30 / 1e3, "edit")  # later replies: 0.95x ar
    assert planner.best("edit")[0].method == "lookup"  # ar is not 15% faster than that
    planner.observe_time(first, 400, 400 * 1.3 * 30 / 1e3, "edit")  # and then slower than ar
    assert planner.best("edit")[0].method == "ar"
    # a chat request has its own evidence: nothing measured there yet
    assert planner.measured.get(("chat", "lookup")) is None
    assert planner.best("chat")[0].method == "lookup"


@pytest.mark.parametrize("draft_ms, probed", [(10.0, False), (0.5, True)])
def test_a_drafting_copy_is_priced_on_what_the_copy_measured(draft_ms: float, probed: bool) -> None:
    """Whole files: lookup measured 1.05x ar on one type-hint file, and `auto` then opened the
    next file with staged on its prior (1.6x ar) and paid 17 s of draft reads where lookup alone
    ran 2.6x. Untried, staged and splice are what the copy measured plus a draft row a token:
    probed where the draft's row is cheap beside that, not where it costs a third of a step."""
    planner = Planner.of(table(30, 1.0), CostTable(last={1: draft_ms, 24: draft_ms * 24},
                                                   full={1: draft_ms, 24: draft_ms * 24}))
    lookup = next(p for p in planner.plans("edit") if p.method == "lookup")
    planner.observe_time(lookup, 400, 400 * 0.95 * 30 / 1e3, "edit")
    known = planner.ms_of(lookup, "edit")
    for method in ("staged", "splice"):
        plan = next(p for p in planner.plans("edit") if p.method == method)
        assert plan.ms_per_token == pytest.approx(known + draft_ms)
    plan, why = planner.best("edit")
    assert (plan.method in ("staged", "splice") and "probing" in why) == probed


def test_an_edit_request_starts_from_the_copy_prior() -> None:
    """Edits copy the request: lookup's prior there is 2x ar, above what sd is predicted on a
    machine where sd pays a little, so the first edit runs lookup, not sd."""
    planner = Planner.of(table(30, 0.15), table(6, 0.15))
    sd = min(p.ms_per_token for p in planner.plans("edit") if p.method == "sd")
    assert sd < planner.raw_ms("ar") * 0.9  # sd pays here
    assert planner.best("edit")[0].method == "lookup"
    assert planner.best("chat")[0].method == "sd"  # on fresh text the copy priors are ~ar


def test_a_few_slow_tokens_do_not_rule_a_plan_out() -> None:
    """Held-out edits 40-49 (session 7): 8 tokens of a reply's start priced lookup at 0.89x ar,
    and sd then ran every edit at 1.28x ar where lookup ran 2.42x. Until a plan has run
    PROBE_TOKENS tokens on a kind, the better of its prior and its measurement decides
    whether it is probed."""
    planner = Planner.of(table(30, 0.15), table(6, 0.15))
    lookup = next(p for p in planner.plans("edit") if p.method == "lookup")
    planner.observe_time(lookup, 8, 8 * 1.12 * 30 / 1e3, "edit")  # a slow start
    ran = []
    for _ in range(4):  # replies: whatever runs measures 1.25x ar, lookup would measure 2.4x
        plan, why = planner.best("edit")
        ran.append(plan.method)
        if plan.method == "lookup":
            break
        planner.observe_time(plan, 100, 100 * 0.8 * 30 / 1e3, "edit")
    assert ran[0] != "lookup" and ran[-1] == "lookup" and "probing" in why


def test_a_reply_that_copies_little_soon_leaves_the_copy_plan() -> None:
    """Earlier edits (renames, say) measured lookup at half ar's time; this reply (a reformat,
    say) measures it 30% slower than ar: within the reply its own clock decides (earlier
    replies count as REPLY_CARRY tokens), and the next reply starts from the kind's history."""
    planner = Planner.of(table(30, 1.0), None)  # no draft: ar or lookup
    lookup = next(p for p in planner.plans("edit") if p.method == "lookup")
    planner.observe_time(lookup, 2000, 2000 * 0.5 * 30 / 1e3, "edit")  # earlier replies
    planner.start_reply()
    assert planner.best("edit")[0].method == "lookup"
    planner.observe_time(lookup, 96, 96 * 1.3 * 30 / 1e3, "edit")  # this reply
    assert planner.best("edit")[0].method == "ar"
    planner.start_reply()
    assert planner.best("edit")[0].method == "lookup"


def test_an_edit_reply_keeps_its_copy_plan_past_a_slow_start() -> None:
    """aider, whole files (tuning split: encodings.punycode; development report: fnmatch): the
    reply's first 48 tokens (the file's name, the fence, a changed first line) copied 15 of 23
    proposed tokens, `auto` left lookup for ar and wrote the rest, 1,400 tokens of the file
    unchanged, one target call a token (2x the time). On an edit lookup proposes only what its
    evidence says pays, so it runs at ar's speed at worst: mid-reply it is kept. On chat it is
    left as before."""
    planner = Planner.of(table(30, 1.0), None)
    lookup = next(p for p in planner.plans("edit") if p.method == "lookup")
    planner.start_reply()
    planner.observe_time(lookup, 48, 48 * 1.3 * 30 / 1e3, "edit")
    planner.observe_time(lookup, 48, 48 * 1.3 * 30 / 1e3, "chat")
    assert planner.best("edit")[0].method == "ar" and planner.best("chat")[0].method == "ar"
    for kind, kept in (("edit", True), ("chat", False)):
        ctx = SimpleNamespace(kind=kind, approximate_ok=False, remaining=1400,
                              draft_behind=lambda seq: 0)
        switch = Auto._should_switch(ctx, planner, lookup, [0] * 2000)
        assert (switch is None) is kept, (kind, switch)


def test_one_slow_reply_does_not_rule_the_copy_out_for_its_kind() -> None:
    """Report split, whole files: a reformat measured lookup at 1.1x ar's time over 1,400
    tokens, and `auto` then ran the next five edits (renames and f-strings among them, where
    llama.cpp's n-gram copy ran 2.3x) as ar. A plan without the draft costs nothing to try, so
    every reply probes it until it has run PROBE_TOKENS tokens there; its clock then decides."""
    planner = Planner.of(table(30, 1.0), None)
    lookup = next(p for p in planner.plans("edit") if p.method == "lookup")
    planner.observe_time(lookup, 1400, 1400 * 1.1 * 30 / 1e3, "edit")  # the reformat
    planner.start_reply()
    plan, why = planner.best("edit")
    assert plan.method == "lookup" and "probing" in why
    planner.observe_time(lookup, 48, 48 * 0.5 * 30 / 1e3, "edit")  # this reply copies
    assert planner.best("edit")[0].method == "lookup"
    planner.start_reply()
    planner.observe_time(lookup, 48, 48 * 1.3 * 30 / 1e3, "edit")  # this one does not
    assert planner.best("edit")[0].method == "ar"


def test_ar_is_never_probed() -> None:
    """Report split, whole files: after a reformat left lookup predicted 1.1x ar on edits, `auto`
    "probed" ar on each of the five later edits and ran them whole as ar (renames and f-strings
    among them, where lookup had run 2x): ar keeps no clock of its own, so it never counted as
    measured. It is priced by this machine's step and never probed."""
    planner = Planner.of(table(30, 1.0), None)
    lookup = next(p for p in planner.plans("edit") if p.method == "lookup")
    planner.observe_time(lookup, 1400, 1400 * 0.9 * 30 / 1e3, "edit")
    for _ in range(3):
        planner.start_reply()
        plan, why = planner.best("edit")
        assert plan.method == "lookup" and "probing" not in why
        ar = next(p for p in planner.plans("edit") if p.method == "ar")
        assert not planner.unproven("edit", ar)
        planner.observe_time(plan, 48, 48 * 0.9 * 30 / 1e3, "edit")


def test_an_unmeasured_drafting_plan_is_no_ground_for_a_catch_up() -> None:
    """Whole files: 80 tokens into a reply `auto` left lookup for staged, on staged's prior
    alone, and paid the draft's 19 s read of 1,800 tokens. Mid-reply, a plan whose draft is
    behind is switched to only once it is measured on the kind."""
    planner = Planner.of(table(30, 0.05), table(6, 0.05))
    lookup = next(p for p in planner.plans("edit") if p.method == "lookup")
    planner.observe_time(lookup, 200, 200 * 1.2 * 30 / 1e3, "edit")  # lookup runs slow here
    best = planner.best("edit", depth=1800)[0]
    assert strategy_of(best).uses_draft and planner.unproven("edit", best)
    ctx = SimpleNamespace(kind="edit", approximate_ok=False, remaining=1900,
                          draft_behind=lambda seq: len(seq))
    assert Auto._should_switch(ctx, planner, lookup, [0] * 1800) is None


def test_measured_times_are_kept_against_ar_at_their_depth() -> None:
    """A plan's measured time is a ratio to ar's step at the depth it ran: 45 ms a token after
    2,000 tokens, where ar's step costs 60, is as fast (0.75x ar's time) as 22.5 ms after 64."""
    t = table(30, 1.0)
    t.deep = {2000: CostTable(last={1: 60.0}, full={1: 60.0})}
    planner = Planner.of(t, None)
    lookup = next(p for p in planner.plans("edit") if p.method == "lookup")
    planner.observe_time(lookup, 400, 400 * 45 / 1e3, "edit", depth=2000)
    assert planner.measured[("edit", "lookup")].value == pytest.approx(0.75, rel=0.02)


# ---------------------------------------------------------------------------- the engine


@pytest.fixture(scope="module")
def engine(fixture_target_path: Path, fixture_draft_path: Path, tmp_path_factory, monkeypatch_module):
    monkeypatch_module.setenv("SPRINTER_EDGE_CACHE", str(tmp_path_factory.mktemp("cache")))
    with Engine(fixture_target_path, fixture_draft_path, method="auto", verifier="confidence",
                hardware=Hardware(n_ctx=1024, n_threads=1)) as eng:
        yield eng.load()


@pytest.fixture(scope="module")
def monkeypatch_module():
    mp = pytest.MonkeyPatch()
    yield mp
    mp.undo()


@pytest.mark.slow
def test_costs_are_measured_once_and_cached(engine: Engine) -> None:
    first = machine_costs(engine.target)
    again = machine_costs(engine.target)
    assert first.to_dict() == again.to_dict()  # from the cache, not a second measurement
    assert first.cost(1) > 0 and first.cost(8) >= first.cost(1)


def test_auto_reports_its_plan(engine: Engine) -> None:
    result = engine.generate("Name a fruit.", SamplingParams(max_tokens=12))
    s = result.stats
    assert s.method == "auto" and s.trace.plan and s.trace.plan_reason
    assert s.to_dict()["plan"] == s.trace.plan


def test_switching_plans_mid_reply_keeps_greedy_output_exact(engine: Engine) -> None:
    prompt = "Write a short story about a lighthouse keeper."
    ar = engine.generate(prompt, SamplingParams(max_tokens=80), method="ar")
    # sd(k=3) -> ar -> staged -> sd(k=1) -> lookup ...: each switch re-syncs the models' caches
    sd = Speculative()
    script = [sd.plan(100.0, draft_len=3), Plan("ar", 100.0), Plan("staged", 100.0),
              sd.plan(100.0, draft_len=1), Plan("lookup", 100.0)]
    engine.set_planner(Scripted(engine.planner(), script))
    try:
        auto = engine.generate(prompt, SamplingParams(max_tokens=80))
    finally:
        engine.set_planner(None)
    assert auto.token_ids == ar.token_ids
    assert auto.stats.trace.plan_switches >= 2
    assert auto.stats.counters.accepted + auto.stats.counters.resampled > 0  # sd really ran
    assert auto.stats.counters.target_sampled > 0  # and so did ar


def test_auto_that_picks_ar_never_touches_the_draft(engine: Engine) -> None:
    engine.set_planner(Scripted(engine.planner(), [Plan("ar", 1.0)]))
    try:
        engine.draft.reset()
        result = engine.generate("Count to five.", SamplingParams(max_tokens=10))
    finally:
        engine.set_planner(None)
    assert result.stats.counters.draft_calls == 0 and result.stats.trace.plan == "ar"
    assert engine.draft.tokens == []  # not even a prefill: time to first token is ar's


@pytest.mark.slow
def test_auto_without_a_draft_runs_one_model(fixture_target_path: Path) -> None:
    with Engine(fixture_target_path, None, method="auto",
                hardware=Hardware(n_ctx=512, n_threads=1)) as eng:
        result = eng.generate("Hi", SamplingParams(max_tokens=4))
    assert result.stats.trace.plan in COPY_PLANS and result.stats.counters.draft_calls == 0


def test_default_auto_is_exact_even_where_sprinter_would_be_fastest(engine: Engine) -> None:
    """A flat-cost machine where SPRINTER is predicted fastest: without an operating point auto
    never runs it (greedy output identical to ar); with one it may."""
    flat = Planner.of(table(30, 0.0), table(3, 0.0))
    assert flat.best(approximate=True)[0].method == "sprinter"
    prompt = "Write a short story about a lighthouse keeper."
    ar = engine.generate(prompt, SamplingParams(max_tokens=40), method="ar")
    engine.set_planner(flat)
    try:
        exact = engine.generate(prompt, SamplingParams(max_tokens=40))
        engine.set_planner(Planner.of(table(30, 0.0), table(3, 0.0)))  # before any measurement
        approx = engine.generate(prompt, SamplingParams(max_tokens=40),
                                 operating_point=OperatingPoint(preset="fast"))
    finally:
        engine.set_planner(None)
    assert exact.token_ids == ar.token_ids and exact.stats.exact
    assert not any(p.startswith("sprinter") for p in exact.stats.trace.plans_run)
    assert exact.stats.guarantee.startswith("exact")
    assert any(p.startswith("sprinter") for p in approx.stats.trace.plans_run) and not approx.stats.exact
    assert approx.stats.guarantee.startswith("approximate")


def test_auto_stays_exact_on_edit_requests_whatever_the_operating_point(engine: Engine) -> None:
    """Where SPRINTER is predicted fastest and the caller chose a preset, an edit request (code
    in a fenced block) still gets an exact plan: SPRINTER skips edits (EXACT_KINDS)."""
    prompt = ("Rename the function to `grow`.\n```python\ndef add(a, b):\n    total = a + b\n"
              "    return total\n\n\nprint(add(1, 2))\n```")
    engine.set_planner(Planner.of(table(30, 0.0), table(3, 0.0)))
    try:
        edit = engine.generate(prompt, SamplingParams(max_tokens=24),
                               operating_point=OperatingPoint(preset="fast"))
    finally:
        engine.set_planner(None)
    assert edit.stats.kind == "edit" and edit.stats.exact
    assert not any(p.startswith("sprinter") for p in edit.stats.trace.plans_run), edit.stats.trace.plans_run
    assert edit.stats.guarantee.startswith("exact") and edit.stats.counters.kept == 0


def test_cost_tables_are_made_monotone() -> None:
    t = CostTable(last={1: 10.0, 4: 40.0, 5: 35.0, 8: 60.0}, full={1: 10.0, 4: 38.0, 5: 50.0, 8: 70.0})
    t.make_monotone()
    assert t.last == {1: 10.0, 4: 40.0, 5: 40.0, 8: 60.0}
    assert t.full[4] == 40.0  # all rows never cheaper than the last row alone
    assert all(t.cost(n) <= t.cost(n + 1) for n in range(1, 8))


def test_pair_acceptance_priors_reach_the_planner(engine: Engine) -> None:
    from sprinter_edge.catalog.registry import Acceptance
    from sprinter_edge.planning.planner import make_planner

    acc = Acceptance(sd_accept=0.9, flagged_accept=0.6, flag_rate={0.5: 0.05, 0.9: 0.15})
    planner = make_planner(engine.target, engine.draft, engine.verifier, 0.85, {"run_cap": 20}, acc)
    rates = planner.evidence.rates
    assert rates[ACCEPT].value == 0.9 and rates[FLAGGED_ACCEPT].value == 0.6
    assert rates[FLAG_RATE].value == 0.15  # the nearest measured threshold
    assert planner.verifier_ms > 0
    # no pair measurements and an uncalibrated verifier: generic priors
    generic = make_planner(engine.target, engine.draft, engine.verifier, 0.85, {"run_cap": 20})
    assert FLAG_RATE not in generic.evidence.rates  # nothing measured: sprinter's own prior holds
    assert generic.evidence.rate(FLAG_RATE, PRIORS[FLAG_RATE]).value == 0.2


def test_malformed_pair_acceptance_is_refused() -> None:
    from sprinter_edge.catalog.registry import _parse_acceptance
    from sprinter_edge.errors import RegistryError

    with pytest.raises(RegistryError, match="acceptance"):
        _parse_acceptance("p", {"sd_accept": 0.9, "flag_rate": {"0.5": 0.1}})
    with pytest.raises(RegistryError, match=r"\[0, 1\]"):
        _parse_acceptance("p", {"sd_accept": 1.5, "flagged_accept": 0.5, "flag_rate": {"0.5": 0.1}})


def test_time_to_first_token_is_reported(engine: Engine) -> None:
    s = engine.generate("Name a colour.", SamplingParams(max_tokens=6), method="sd").stats
    assert s.timings.prefill_seconds < s.timings.first_token_seconds <= s.timings.total_seconds
