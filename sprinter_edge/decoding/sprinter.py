"""`sprinter`: sequential approximate verification (arXiv 2502.04557).

The draft generates one token at a time and the verifier scores each from the draft's view
(its logits or hidden state at that position). Tokens it passes are committed without the
target. When it flags a token (score < threshold), or the run reaches the run cap, the target
catches up on every pending token plus the flagged one in ONE decode call, the SD test is
applied to the flagged token only (residual resample on reject, bonus token on accept), and
both KV caches roll back to the committed sequence.

Output distribution. Let p and q be the target's and the draft's next-token distributions
after the sampling transform (temperature, top-k, top-p; greedy: one-hot argmax). When the
verifier's score does not depend on the sampled token -- true of the confidence rule and the
shipped ONNX verifier, which read the draft's max probability or hidden state at the context
-- its decision `pass` at a context is fixed before the token is drawn, and the next token is
distributed as pass * q + (1 - pass) * p (a flagged token goes through the SD test, whose
output is distributed as p; so does a token sent to the target by the run cap, a function of
the context). The distance from the target there is 1[pass] * TV(p, q), and the drift per
token is the mean of that along the output, at the sampling settings used (`sprinter-edge
bench`: "TV drift/tok"). The end-of-generation check depends on the drawn token and only
moves the end token's excess mass toward p; the accounting counts such a position as not
passed. Under greedy decoding TV(p, q) = 1[argmax differs] and the mean is
eta_FP * P(argmax differs), eta_FP the false-pass rate on the greedy label; at
temperature > 0 no such identity holds, and a verifier with eta_FP = 0 still drifts.

A verifier may also read the drawn token (features `logq_x`, `q_ratio`); then the mixture
above does not hold, and the expected false passes per token -- the mean of
1[pass] * (1 - min(1, p(x)/q(x))), what `verifier study` compares -- is the figure to read.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

from ..verifiers.base import DraftFeatures
from .base import DecodeContext, Origin, Step, Strategy


class Sprinter(Strategy):
    name = "sprinter"
    needs_draft = True
    uses_draft = True
    needs_verifier = True

    def target_rows(self, n_tokens: float) -> float:
        return 2.0  # the flagged token and the bonus token

    def run(self, ctx: DecodeContext, prompt: list[int]) -> Iterator[Step]:
        assert ctx.draft is not None
        verifier = ctx.verifier
        assert verifier is not None
        sampler, stats, draft = ctx.sampler, ctx.stats, ctx.draft
        seq = list(prompt)
        temperature = 0.0 if sampler.params.greedy else sampler.params.temperature
        since_flag = 0  # run history a verifier may read: tokens drafted since the last flag,
        last_outcome = 0  # and the last catch-up's test (0 none yet, 1 accepted, 2 rejected)
        while True:
            run = 0
            while True:  # draft until a token is flagged
                out = ctx.draft_step(seq, hidden=verifier.needs_hidden)
                logits = out.logits[0]
                q = sampler.prepare(logits, seq)
                token = sampler.draw(q)
                stats.draft_tokens += 1
                at_cap = ctx.run_cap is not None and run + 1 >= ctx.run_cap
                must_verify = at_cap or (ctx.verify_eog and draft.is_eog(token))
                if not must_verify:
                    t0 = time.perf_counter()
                    score = verifier.score(DraftFeatures(
                        hidden=out.hidden[0] if out.hidden is not None else None,
                        logits=logits, token=token, run_position=run,
                        output_position=ctx.produced, temperature=temperature,
                        since_flag=since_flag, last_outcome=last_outcome,
                    ))
                    stats.verifier_seconds += time.perf_counter() - t0
                    if score >= ctx.threshold:
                        seq.append(token)
                        run += 1
                        since_flag += 1
                        yield [(token, Origin.KEPT)]
                        continue
                    stats.flags += 1
                    since_flag = 0
                else:
                    since_flag += 1
                    if at_cap:
                        stats.cap_hits += 1
                    else:
                        stats.eog_checks += 1
                break

            # Catch-up: pending tokens + the flagged one, one target decode, last two rows.
            out = ctx.target_step(seq + [token], n_logits=2)
            stats.sd_tests += 1
            ok, replacement = sampler.verify(token, sampler.prepare(out.logits[0], seq), q)
            last_outcome = 1 if ok else 2
            if not ok:
                seq.append(replacement)
                yield [(replacement, Origin.RESAMPLED)]
                continue
            step: Step = [(token, Origin.ACCEPTED)]
            if not draft.is_eog(token):
                step.append((sampler.draw(sampler.prepare(out.logits[1], seq + [token])),
                             Origin.BONUS))
            seq.extend(t for t, _ in step)
            yield step
