"""sprinter-edge: faster local LLM generation on small machines.

Public API: `Engine` (load a pair, generate, stream, chat), `Hardware` (threads, context,
GPU layers), `SamplingParams` (per call), `OperatingPoint` (SPRINTER's), and the result types."""

from __future__ import annotations

__version__ = "0.1.0"

from .api import Engine, Hardware  # noqa: E402
from .decoding import Chunk, Generation, GenerationResult, SamplingParams, Stats  # noqa: E402
from .errors import SprinterError  # noqa: E402
from .verifiers.operating_point import OperatingPoint  # noqa: E402

__all__ = [
    "Chunk", "Engine", "Generation", "GenerationResult", "Hardware", "OperatingPoint", "SamplingParams",
    "SprinterError", "Stats", "__version__",
]
