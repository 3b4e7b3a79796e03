"""A planner that answers a fixed sequence of plans, to force `auto`'s switches in tests."""

from __future__ import annotations

from sprinter_edge.decoding import Plan
from sprinter_edge.planning.planner import Planner


class Scripted(Planner):
    """The engine's planner (its costs and evidence), answering `script` in order: each look
    at the evidence gets the next plan, and whatever runs looks slow, so each look switches."""

    def __init__(self, base: Planner, script: list[Plan]):
        super().__init__(base.costs, base.evidence)
        self.script, self.calls = script, 0

    def best(self, kind: str = "chat", approximate: bool = False, depth: int = 0) -> tuple[Plan, str]:
        plan = self.script[min(self.calls, len(self.script) - 1)]
        self.calls += 1
        return plan, "scripted"

    def opening(self, kind: str, approximate: bool, prompt_tokens: int, reply_tokens: int,
                draft_behind: int) -> tuple[Plan, str]:
        return self.best(kind, approximate, prompt_tokens)  # the script, whatever the prompt

    def unproven(self, kind: str, plan: Plan) -> bool:
        return False  # the script decides, measured or not

    def ms_of(self, plan: Plan, kind: str = "chat", depth: int = 0) -> float:
        return plan.ms_per_token * 10
