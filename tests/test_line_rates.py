"""A copy is priced per kind of source line: the line's first non-blank token (the fixture
target's tokenizer), and the proposal is cut where its tokens per millisecond peak."""

from __future__ import annotations

from support.costs import flat

from sprinter_edge.costs.pricing import best_length, best_prefix
from sprinter_edge.costs.table import CostTable
from sprinter_edge.decoding.proposers.line_rates import PRIOR_WEIGHT, LineRates

CODE = '''def area(width, height):
    total = width * height

    return total


def perimeter(width, height):
    return 2 * (width + height)
'''


def compute_bound() -> CostTable:  # every row about 20 ms, one step 40 ms
    return CostTable(last={n: 40.0 + 2.0 * (n - 1) for n in range(1, 33)},
                     full={n: 40.0 + 20.0 * (n - 1) for n in range(1, 33)})


def test_one_rate_for_every_token_prices_as_best_length() -> None:
    table = compute_bound()
    for a in (0.4, 0.9, 0.98):
        assert best_prefix([a] * 20, table) == best_length(a, 20, table)[0]
    assert best_prefix([0.99] * 20, flat()) == 20


def test_the_proposal_ends_before_a_token_the_target_is_likely_to_refuse() -> None:
    table = compute_bound()
    sure = best_prefix([0.99] * 12, table)
    assert sure >= 10
    assert best_prefix([0.99] * 5 + [0.05] + [0.99] * 6, table) == 5  # the unsure one and after: not paid for
    assert best_prefix([0.05] * 12, table) == 0  # a plain step is cheaper


def test_a_token_is_of_the_kind_of_its_source_line(fixture_engine) -> None:  # type: ignore[no-untyped-def]
    model = fixture_engine.target
    seq = model.tokenize(CODE, add_special=False, special=False)
    lines = LineRates(model)
    text = [model.token_bytes(t) for t in seq]
    at = {name: next(i for i, b in enumerate(text) if b.strip() == name)
          for name in (b"total", b"height", b"perimeter")}
    def_head, total_head = seq[0], seq[at[b"total"]]
    assert model.token_bytes(def_head).strip() == b"def"
    assert lines.head(seq, at[b"height"]) == def_head  # a parameter in the `def` line
    assert lines.head(seq, at[b"perimeter"]) == def_head  # the second `def` line is of the same kind
    assert lines.head(seq, at[b"total"] + 2) == total_head  # `width` after `total =`
    returns = [i for i, b in enumerate(text) if b.strip() == b"return"]
    assert lines.head(seq, returns[0] + 1) == lines.head(seq, returns[1] + 1) == seq[returns[0]]
    assert LineRates(None).head(seq, 3) == -1  # no tokenizer: no kinds


def test_a_kind_the_target_refused_is_priced_below_the_copys_rate() -> None:
    lines = LineRates(None)
    assert lines.rates(0.9, [1, 2]) == [0.9, 0.9]  # nothing seen: the copy's own rate
    for _ in range(3):
        lines.score([1, 1, 1, 2, 1], accepted=3)  # three `1` lines kept, then a `2` line refused
    body, edited = lines.rates(0.9, [1, 2])
    assert body > 0.9 > edited
    assert edited == PRIOR_WEIGHT * 0.9 / (3 + PRIOR_WEIGHT)  # three refusals, none kept
