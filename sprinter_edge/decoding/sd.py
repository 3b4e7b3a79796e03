"""`sd`: standard speculative decoding (Leviathan et al. 2023; Chen et al. 2023).

Each round the draft proposes up to k tokens; the target scores all of them in one decode;
the p/q test accepts a prefix, a rejected token is replaced from the residual, and when
every draft token passes the target adds a bonus token. Lossless: the output is
distributed exactly as the target's (token-identical under greedy decoding)."""

from __future__ import annotations

from collections.abc import Iterator

from .base import DecodeContext, Origin, Step, Strategy


class Speculative(Strategy):
    name = "sd"
    needs_draft = True
    uses_draft = True
    exact = True

    def target_rows(self, n_tokens: float) -> float:
        return n_tokens  # every drafted token plus the bonus row

    def run(self, ctx: DecodeContext, prompt: list[int]) -> Iterator[Step]:
        assert ctx.draft is not None
        sampler, stats = ctx.sampler, ctx.stats
        seq = list(prompt)
        while True:
            k = max(1, min(ctx.draft_len, ctx.remaining))
            drafted: list[int] = []
            qs = []
            for _ in range(k):
                context = seq + drafted
                q = sampler.prepare(ctx.draft_step(context).logits[0], context)
                token = sampler.draw(q)
                drafted.append(token)
                qs.append(q)
                if ctx.draft.is_eog(token):
                    break
            stats.draft_tokens += len(drafted)

            full = seq + drafted
            out = ctx.target_step(full, n_logits=len(drafted) + 1)
            step: Step = []
            # the target's row i scores the token after seq + drafted[:i], as the draft's did
            for i, token in enumerate(drafted):
                stats.sd_tests += 1
                row = out.logits[i]
                p = sampler.prepare(row, full[:len(seq) + i])
                ok, replacement = sampler.verify(token, p, qs[i])
                if not ok:
                    assert replacement is not None
                    ctx.record_target(row, replacement)
                    step.append((replacement, Origin.RESAMPLED))
                    break
                ctx.record_target(row, token)
                step.append((token, Origin.ACCEPTED))
            else:
                if not ctx.draft.is_eog(drafted[-1]):
                    row = out.logits[len(drafted)]
                    bonus = sampler.draw(sampler.prepare(row, full))
                    ctx.record_target(row, bonus)
                    step.append((bonus, Origin.BONUS))
            seq.extend(t for t, _ in step)
            yield step
