"""Decoding strategies side by side behind one interface (see base.py)."""

from __future__ import annotations

from ..errors import SettingsError
from .ar import Autoregressive
from .auto import Auto
from .base import DecodeContext, Origin, Stats, Strategy
from .draft import DraftOnly
from .guarded import Guarded
from .lookup import Lookup
from .sampling import Sampler, SamplingParams
from .sd import Speculative
from .sprinter import Sprinter
from .staged import Staged
from .stream import Chunk, Generation, GenerationResult

STRATEGIES: dict[str, type[Strategy]] = {
    cls.name: cls for cls in (Auto, Autoregressive, Speculative, Lookup, Staged, Sprinter, Guarded, DraftOnly)
}
METHODS = tuple(STRATEGIES)


def get_strategy(name: str) -> Strategy:
    try:
        return STRATEGIES[name]()
    except KeyError:
        raise SettingsError(f"unknown method {name!r}; choose from {', '.join(METHODS)}") from None


__all__ = [
    "METHODS", "STRATEGIES", "Chunk", "DecodeContext", "Generation", "GenerationResult",
    "Origin", "Sampler", "SamplingParams", "Stats", "Strategy", "get_strategy",
]
