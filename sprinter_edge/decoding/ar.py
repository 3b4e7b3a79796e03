"""`ar`: the target alone, one token per decode (the baseline a user has today)."""

from __future__ import annotations

from collections.abc import Iterator

from .base import DecodeContext, Origin, Step, Strategy


class Autoregressive(Strategy):
    name = "ar"

    def run(self, ctx: DecodeContext, prompt: list[int]) -> Iterator[Step]:
        seq = list(prompt)
        while True:
            out = ctx.target_step(seq)
            token = ctx.sampler.draw(ctx.sampler.prepare(out.logits[0]))
            seq.append(token)
            yield [(token, Origin.TARGET)]
