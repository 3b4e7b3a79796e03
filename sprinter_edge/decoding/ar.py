"""`ar`: the target alone, one token per decode (the baseline a user has today)."""

from __future__ import annotations

from collections.abc import Iterator

from .base import DecodeContext, Origin, Step, Strategy


class Autoregressive(Strategy):
    name = "ar"
    exact = True

    def run(self, ctx: DecodeContext, prompt: list[int]) -> Iterator[Step]:
        seq = list(prompt)
        while True:
            row = ctx.target_step(seq).logits[0]
            token = ctx.sampler.draw(ctx.sampler.prepare(row, seq))
            ctx.record_target(row, token)
            seq.append(token)
            yield [(token, Origin.TARGET)]
