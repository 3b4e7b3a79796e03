"""The package's shape, checked: no import cycle, the layers in order, and a method that is
one file plus a registry line."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from sprinter_edge import Engine, SamplingParams
from sprinter_edge.costs import CostTable
from sprinter_edge.decoding import STRATEGIES, DecodeContext, Plan, PriceInputs, RoundPrice
from sprinter_edge.decoding.loop import LoopStrategy
from sprinter_edge.decoding.proposers.base import Proposal, Proposer
from sprinter_edge.methods import get_strategy
from sprinter_edge.planning.planner import Planner

PACKAGE = Path(__file__).resolve().parent.parent / "sprinter_edge"
# a layer may import the layers below it, never those above (a name: the first dotted part)
LAYERS = [
    {"errors", "numerics", "resources"},
    {"backend", "verifiers", "costs", "grammar"},
    {"decoding", "catalog", "prompting"},
    {"planning"},
    {"methods", "api", "training"},
    {"serving", "bench", "cli", "__main__"},
]


def _module(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _resolve(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    base = module.split(".") if is_package else module.split(".")[:-1]
    if node.level:
        base = base[: len(base) - node.level + 1]
        return ".".join(base + ([node.module] if node.module else []))
    return node.module or ""


def _type_checking_lines(tree: ast.Module) -> set[int]:
    """Lines of `if TYPE_CHECKING:` blocks (imports for annotations only, never run)."""
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for sub in ast.walk(node):
                if hasattr(sub, "lineno"):
                    lines.add(sub.lineno)
    return lines


def import_graph() -> dict[str, set[str]]:
    """module -> the package's modules it imports when it runs (function-level imports too)."""
    files = {_module(p): p for p in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        tree = ast.parse(path.read_text())
        skip = _type_checking_lines(tree)
        edges: set[str] = set()
        for node in ast.walk(tree):
            if getattr(node, "lineno", None) in skip:
                continue
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                mod = _resolve(name, path.name == "__init__.py", node)
                targets = [mod] + [f"{mod}.{a.name}" for a in node.names]
            for t in targets:
                if t in files and t != name:
                    edges.add(t)
        graph[name] = edges
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(n: str) -> list[str] | None:
        state[n] = 1
        stack.append(n)
        for m in sorted(graph.get(n, ())):
            if state.get(m) == 1:
                return stack[stack.index(m):] + [m]
            if m not in state:
                found = visit(m)
                if found:
                    return found
        stack.pop()
        state[n] = 2
        return None

    for n in sorted(graph):
        if n not in state:
            found = visit(n)
            if found:
                return found
    return None


def _layer(module: str) -> int:
    top = module.split(".")[1] if "." in module else module
    for i, names in enumerate(LAYERS):
        if top in names:
            return i
    raise AssertionError(f"{module} is in no layer: add its folder to LAYERS")


def test_no_import_cycle() -> None:
    graph = import_graph()
    assert len(graph) > 50  # the walk found the package
    assert _cycle(graph) is None, " -> ".join(_cycle(graph) or [])


def test_the_walk_finds_a_cycle() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]


def test_layers_import_only_downward() -> None:
    upward = [(a, b) for a, targets in import_graph().items() if a != "sprinter_edge"
              for b in targets if b != "sprinter_edge" and _layer(b) > _layer(a)]
    assert not upward, upward


# ---------------------------------------------------------------------------- a new method
class RepeatLast(Proposer):
    """Proposes the last token again (a point mass: the loop stays exact)."""

    def propose(self, ctx: DecodeContext, seq: list[int]) -> Proposal:
        return Proposal([seq[-1]], [seq[-1]])


class Toy(LoopStrategy):
    name = "toy"

    def plans(self, inputs: PriceInputs) -> list[Plan]:
        return [Plan(self.name)]

    def price(self, plan: Plan, inputs: PriceInputs) -> RoundPrice:
        return RoundPrice(0.0, inputs.costs.target.cost(2, 2), 100.0, 2.0)  # claims a lot

    def make_proposer(self, ctx: DecodeContext, plan: Plan | None = None) -> Proposer:
        return RepeatLast()


@pytest.fixture
def toy(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(STRATEGIES, Toy.name, Toy)  # the registry line


def test_a_method_is_its_strategy_and_a_registry_line(toy: None, fixture_engine: Engine) -> None:
    assert isinstance(get_strategy("toy"), Toy)
    params = SamplingParams(max_tokens=24)
    ar = fixture_engine.generate("Count from one to ten.", params, method="ar")
    got = fixture_engine.generate("Count from one to ten.", params, method="toy")
    assert got.token_ids == ar.token_ids and got.stats.method == "toy" and got.stats.exact
    assert got.stats.counters.sd_tests > 0  # its proposals went through the p/q test
    # auto prices it through the registry and, told it is cheap, runs it
    table = CostTable(last={1: 30.0, 32: 60.0}, full={1: 30.0, 32: 600.0})
    planner = Planner.of(table, table)
    assert planner.best()[0].method == "toy"
    fixture_engine.set_planner(planner)
    try:
        result = fixture_engine.generate("Count from one to ten.", params, method="auto")
    finally:
        fixture_engine.set_planner(None)
    assert result.stats.trace.plans_run[0] == "toy" and result.token_ids == ar.token_ids
