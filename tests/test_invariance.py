"""Exactness claims that hold on the machine at hand: the batch invariance doctor measures, and
a long greedy reply checked against it (near-ties meet a reply of hundreds of tokens)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from sprinter_edge import Engine, Hardware, SamplingParams
from sprinter_edge.backend import invariance
from sprinter_edge.backend.llama import LlamaModel, LoadOptions

LONG_EDIT = ("Add type hints to every function and a one-line docstring to each. Return the whole code "
             "in one python code block.\n\n```python\n"
             + "".join(f"def scale_{i}(values, factor):\n    out = []\n    for v in values:\n"
                       f"        out.append(v * factor + {i})\n    return out\n\n\n" for i in range(8))
             + "```")


def test_drift_compares_batched_rows_with_single_steps(fixture_target_path: Path) -> None:
    model = LlamaModel(fixture_target_path, LoadOptions(n_ctx=512, n_threads=1))
    try:
        drifts = invariance.drift(model, sizes=(4, 16))
        assert [d.k for d in drifts] == [4, 16]
        assert all(d.max_abs >= 0.0 and 0 <= d.argmax_flips <= d.k for d in drifts)
        # the same call twice is the same arithmetic: no drift against itself
        tokens = model.tokenize(invariance._TEXT)[: invariance.CONTEXT + 4]
        model.sync(tokens[:-4], n_logits=0)
        a = model.eval(tokens[-4:], n_logits=4).logits.copy()
        model.rollback(invariance.CONTEXT)
        b = model.eval(tokens[-4:], n_logits=4).logits
        assert np.array_equal(a, b)
    finally:
        model.close()
    line = invariance.Invariance(False, drifts).line()
    assert line.startswith("repacking off") and ("batch-invariant" in line)


def _first_flip(engine: Engine, prompt: str, ar_ids: list[int], other_ids: list[int]) -> tuple[int, float]:
    """Where two greedy replies part, and the target's top-2 logit margin there (one-token step)."""
    i = next(i for i, (a, b) in enumerate(zip(ar_ids, other_ids, strict=False)) if a != b)
    model = engine.target
    model.reset()
    row = model.sync(engine.encode(prompt) + ar_ids[:i], n_logits=1).logits[0]
    top = np.sort(row)[-2:]
    return i, float(top[1] - top[0])


@pytest.mark.integration
def test_long_greedy_lookup_follows_ar_where_the_machine_is_batch_invariant(
        default_pair_paths: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    """320 tokens of a copy-heavy reply, repacking off: token-identical to ar where doctor's
    measurement says the kernels are batch-invariant here; elsewhere the flip must be a near-tie
    (and the test says where and by how much)."""
    monkeypatch.setenv("SPRINTER_EDGE_EXTRA_BUFFERS", "0")
    draft, target = default_pair_paths
    with Engine(target, None, hardware=Hardware(n_ctx=2048, n_threads=2)) as engine:
        measured = invariance.Invariance(False, invariance.drift(engine.target))
        params = SamplingParams(max_tokens=320)
        ar = engine.generate(LONG_EDIT, params, method="ar")
        lookup = engine.generate(LONG_EDIT, params, method="lookup")
        # copy-heavy enough that batched calls decide the reply (how much is copied follows this
        # machine's cost table: 81 of 320 tokens on the EPYC Zen 4's table measured at depth)
        assert len(ar.token_ids) >= 200 and lookup.stats.counters.copied_accepted > 50
        if lookup.token_ids == ar.token_ids:
            return
        at, margin = _first_flip(engine, LONG_EDIT, ar.token_ids, lookup.token_ids)
        assert not measured.invariant, f"invariant kernels, yet the replies part at token {at}"
        biggest = max(d.max_abs for d in measured.drifts)
        assert margin <= 2 * biggest, (at, margin, measured.line())
        print(f"\ngreedy lookup left ar's path at token {at}: top-2 margin {margin:.3f}, "
              f"{measured.line()}")
