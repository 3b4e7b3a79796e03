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

from .base import DecodeContext
from .loop import LoopStrategy
from .proposers.base import Proposer
from .proposers.draft import DraftProposer, VerifierRun


class Sprinter(LoopStrategy):
    name = "sprinter"
    needs_draft = True
    uses_draft = True
    needs_verifier = True
    exact = False

    def target_rows(self, n_tokens: float) -> float:
        return 2.0  # the flagged token and the bonus token

    def make_proposer(self, ctx: DecodeContext) -> Proposer:
        assert ctx.verifier is not None
        return DraftProposer(VerifierRun(ctx.verifier, ctx.threshold, ctx.run_cap, ctx.verify_eog))
