"""Decoding: strategies side by side behind one interface (strategy.py), the speculative loop
they share (loop.py, proposers/, acceptor.py), the sampler and the driver (stream.py).

`STRATEGIES` is the registry of the methods decoding implements; `auto`, which chooses among
them, sits above in planning/ (sprinter_edge.methods lists both)."""

from __future__ import annotations

from .ar import Autoregressive
from .context import DecodeContext, Step, TokenLogprob
from .draft_only import DraftOnly
from .guarded import Guarded
from .lookup import Lookup
from .registry import STRATEGIES, all_settings
from .sampling import Sampler, SamplingParams
from .sd import Speculative
from .settings import Setting
from .splice import Splice
from .sprinter import Sprinter
from .staged import Staged
from .stats import Counters, Origin, PlanTrace, PointUsed, Stats, Timings
from .strategy import Plan, PriceInputs, RoundPrice, Strategy
from .stream import Chunk, Generation, GenerationResult, PromptProgress

# The registry: a new method is its file and a line here. The order is the order `auto`
# prices candidates in (ties go to the first).
STRATEGIES.update({
    cls.name: cls
    for cls in (Autoregressive, Lookup, Staged, Splice, Speculative, Sprinter, Guarded, DraftOnly)
})

__all__ = [
    "STRATEGIES", "Chunk", "Counters", "DecodeContext", "Generation", "GenerationResult", "Origin", "Plan",
    "PlanTrace", "PointUsed", "PriceInputs", "PromptProgress", "RoundPrice", "Sampler", "SamplingParams",
    "Setting", "Stats", "Step", "Strategy", "Timings", "TokenLogprob", "all_settings",
]
