"""`draft`: the draft alone (the speed limit of any draft-based method)."""

from __future__ import annotations

from collections.abc import Iterator

from .context import DecodeContext, Step
from .sampling import masked
from .stats import Origin
from .strategy import Strategy


class DraftOnly(Strategy):
    name = "draft"
    about = "the draft alone (approximate)"
    needs_draft = True
    uses_draft = True
    needs_target = False
    exact = False  # the draft's output, never checked

    def guarantee(self, stats: object) -> str:
        return "approximate: the draft model's output, never checked by the target"

    def run(self, ctx: DecodeContext, prompt: list[int]) -> Iterator[Step]:
        seq = list(prompt)
        grammar = ctx.grammar
        while True:
            out = ctx.draft_step(seq)
            row = out.logits[0] if grammar is None else masked(out.logits[0], grammar.mask())
            token = ctx.sampler.draw(ctx.sampler.prepare(row, seq))
            if grammar is not None:
                grammar.consume([token])
            seq.append(token)
            yield [(token, Origin.DRAFT)]
