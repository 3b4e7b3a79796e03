"""The package's shape, checked: no import cycle, the layers in order, and a method that is
one file plus a registry line."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from sprinter_edge import Engine, Hardware, SamplingParams
from sprinter_edge.costs import CostTable, Evidence
from sprinter_edge.decoding import STRATEGIES, DecodeContext, Plan, PriceInputs, RoundPrice, Setting
from sprinter_edge.decoding.loop import LoopStrategy
from sprinter_edge.decoding.proposers.base import Proposal, Proposer
from sprinter_edge.errors import SettingsError
from sprinter_edge.methods import get_strategy, methods
from sprinter_edge.planning.planner import Planner

PACKAGE = Path(__file__).resolve().parent.parent / "sprinter_edge"
# a layer may import the layers below it, never those above (a name: the first dotted part)
LAYERS = [
    {"errors", "numerics", "resources", "processes"},
    {"backend", "verifiers", "costs", "grammar"},
    {"decoding", "catalog", "prompting", "model_pair"},
    {"planning"},
    {"methods", "api", "reply", "verification", "training"},
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
    """Proposes the last token again, `times` times (point masses: the loop stays exact)."""

    def __init__(self, times: int) -> None:
        self.times = times

    def propose(self, ctx: DecodeContext, seq: list[int]) -> Proposal:
        return Proposal([seq[-1]] * self.times, [seq[-1]] * self.times, bumps=("toy_rounds",))


TOY_ACCEPT = "toy.accept"  # the toy's learned rate: how often its repeated token is right


class Toy(LoopStrategy):
    """A method with a knob, a counter and a learned rate of its own, all in this one class."""

    name = "toy"
    settings = (Setting("toy_repeat", 1, "toy: tokens proposed a round", minimum=1),)
    counters = ("toy_rounds",)

    def plans(self, inputs: PriceInputs) -> list[Plan]:
        return [self.plan(toy_repeat=k) for k in (1, 2)]

    def evidence_priors(self) -> dict[str, float]:
        return {TOY_ACCEPT: 0.99}

    def price(self, plan: Plan, inputs: PriceInputs) -> RoundPrice:
        a, k = inputs.evidence.rate(TOY_ACCEPT, 0.99).value, plan.get("toy_repeat")
        tokens = sum(a ** i for i in range(k + 1))
        return RoundPrice(0.0, inputs.costs.target.cost(k + 1, k + 1), tokens, k + 1.0)

    def learn(self, evidence: Evidence, done: dict[str, int]) -> None:
        evidence.rate(TOY_ACCEPT, 0.99).add_counts(done["accepted"], done["resampled"])

    def make_proposer(self, ctx: DecodeContext, plan: Plan | None = None) -> Proposer:
        return RepeatLast(self.setting(ctx, plan, "toy_repeat"))


@pytest.fixture
def toy(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(STRATEGIES, Toy.name, Toy)  # the registry line


PROMPT = "Count from one to ten."


def test_a_method_is_its_strategy_and_a_registry_line(toy: None, fixture_engine: Engine) -> None:
    assert isinstance(get_strategy("toy"), Toy) and "toy" in methods()
    params = SamplingParams(max_tokens=24)
    ar = fixture_engine.generate(PROMPT, params, method="ar")
    got = fixture_engine.generate(PROMPT, params, method="toy", settings={"toy_repeat": 2})
    assert got.token_ids == ar.token_ids and got.stats.method == "toy" and got.stats.exact
    c = got.stats.counters
    assert c.pq_tests > 0 and c.toy_rounds == c.target_calls  # its own counter, bumped each round
    assert got.stats.to_dict()["toy_rounds"] == c.toy_rounds
    gen = fixture_engine.stream(PROMPT, params, method="toy", settings={"toy_repeat": 2})
    assert gen.ctx.settings["draft_len"] == fixture_engine.settings.draft_len  # the rest: the engine's
    gen.close()
    with pytest.raises(SettingsError, match="toy_repeat must be >= 1"):
        fixture_engine.generate(PROMPT, params, method="toy", settings={"toy_repeat": 0})


def test_auto_prices_a_new_method_from_what_it_learned(toy: None, fixture_engine: Engine) -> None:
    """Told it is cheap, auto runs the toy; its rounds teach its rate, which moves its price."""
    table = CostTable(last={1: 30.0, 32: 60.0}, full={1: 30.0, 32: 600.0})
    planner = Planner.of(table, table)
    best = planner.best()[0]
    assert best.method == "toy" and best.label in ("toy(toy_repeat=1)", "toy(toy_repeat=2)")
    before = planner.raw_ms(best)
    fixture_engine.set_planner(planner)
    try:
        result = fixture_engine.generate(PROMPT, SamplingParams(max_tokens=48), method="auto")
    finally:
        fixture_engine.set_planner(None)
    assert result.stats.trace.plans_run[0] == best.label
    learned = planner.evidence.rates[TOY_ACCEPT]
    assert learned.value < 0.99 and planner.raw_ms(best) > before  # repeats are mostly wrong


def test_a_new_method_runs_from_the_cli_and_the_server(toy: None, fixture_target_path: Path,
                                                        fixture_draft_path: Path, capsys) -> None:
    from sprinter_edge.cli import main

    rc = main(["generate", PROMPT, "--target", str(fixture_target_path), "--draft", str(fixture_draft_path),
               "--threads", "1", "--ctx", "1024", "--max-tokens", "16", "--method", "toy",
               "--toy-repeat", "2", "--stats"])
    err = capsys.readouterr().err
    assert rc == 0 and "[toy]" in err and "toy_rounds" in err  # its counter in --stats

    from fastapi import testclient

    from sprinter_edge.serving.server import create_app

    engine = Engine(fixture_target_path, fixture_draft_path, method="ar",
                    hardware=Hardware(n_ctx=1024, n_threads=1))
    try:
        with testclient.TestClient(create_app(engine, model_id="toy")) as client:
            body = {"messages": [{"role": "user", "content": PROMPT}], "max_tokens": 12,
                    "method": "toy", "settings": {"toy_repeat": 2}}
            r = client.post("/v1/chat/completions", json=body)
            assert r.status_code == 200, r.text
            assert r.json()["decoding"]["method"] == "toy" and r.json()["decoding"]["toy_rounds"] > 0
            bad = client.post("/v1/chat/completions", json={**body, "settings": {"nope": 1}})
            assert bad.status_code == 400 and "nope" in bad.json()["error"]["message"]
    finally:
        engine.close()
