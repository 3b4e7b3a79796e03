"""The models a server offers, by id, and the engines loaded for them.

The server starts with one engine, the default model (its pair, or `--target`). It may offer more
(`serve` offers the GGUF models found on this machine, catalog/local.py): a request whose `model`
names one gets it, loaded on first use by the worker (engine_process.py), with the draft found
for it; a name the server does not offer gets the default, as llama.cpp's server does, and the
reply's `model` says which ran.

Memory: before loading a model, the least recently used engines are closed until its files
(target and draft) fit in the memory available now (Linux's MemAvailable). Where that is not
known (no /proc/meminfo: macOS, Windows) one model is loaded at a time. A load that fails while
others are loaded (a GPU's memory, which MemAvailable does not count, may be what ran out) is
tried once more alone.
"""

from __future__ import annotations

import contextlib
import logging
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..api import Engine
from ..backend import host

log = logging.getLogger(__name__)

MEMORY_MARGIN = 1.2  # a model needs its files' bytes and this much more (KV cache, buffers)


@dataclass(frozen=True)
class Offer:
    """A model the server can load: its id (what a request's `model` names) and its files."""

    id: str
    target: Path
    draft: Path | None = None
    owned_by: str = "sprinter-edge"  # where it was found: ollama, lmstudio, hf, ...

    @property
    def size(self) -> int:
        """Bytes of its files: what loading it takes, roughly."""
        total = 0
        for p in (self.target, self.draft):
            if p is not None:
                with contextlib.suppress(OSError):
                    total += p.stat().st_size
        return total

    @property
    def key(self) -> tuple[str, str | None]:
        """Offers of the same files share one engine (an Ollama blob under two tags)."""
        return (str(self.target.resolve()), str(self.draft.resolve()) if self.draft else None)


def offer_engine(engine_kwargs: dict[str, Any], offer: Offer) -> Engine:
    """An engine for `offer` under the server's settings (a module-level function: it crosses to
    the worker process, engine_process.py, as a functools.partial)."""
    return Engine.from_files(offer.target, draft=offer.draft, **engine_kwargs)


class ServedModels:
    """The default model (its engine given, already loading) and the others offered, each
    loaded on first use. `engine()` runs in the worker only; the server reads the ids."""

    def __init__(self, default: Offer, engine: Engine, offers: Sequence[Offer] = (),
                 make: Callable[[Offer], Engine] | None = None,
                 memory: Callable[[], int | None] = host.linux_available_memory):
        self.default = default
        self.offers: dict[str, Offer] = {default.id: default}
        for offer in offers:
            self.offers.setdefault(offer.id, offer)
        self._make = make
        self._memory = memory
        self._engines: OrderedDict[tuple[str, str | None], Engine] = OrderedDict({default.key: engine})

    def ids(self) -> list[str]:
        """Every id offered, the default first."""
        return list(self.offers)

    def pick(self, requested: str | None) -> str:
        """The id that serves a request naming `requested`: it, if offered; else the default."""
        return requested if requested in self.offers else self.default.id

    def loaded(self) -> list[str]:
        """The ids whose engine is loaded now (least recently used first)."""
        return [o.id for key in self._engines for o in self.offers.values() if o.key == key]

    def engine(self, model_id: str) -> Engine:
        """The engine of `model_id`, made and loaded if it is not (others closed first where
        both would not fit in memory)."""
        offer = self.offers[model_id]
        key = offer.key
        if key in self._engines:
            self._engines.move_to_end(key)
            return self._engines[key]
        if self._make is None:
            raise RuntimeError(f"no way to load {model_id!r}")
        need = offer.size * MEMORY_MARGIN
        while self._engines:
            free = self._memory()
            if free is not None and need <= free:
                break
            old_key, old = self._engines.popitem(last=False)
            log.info("unloading %s to load %s (%s)", old_key[0], model_id,
                     "memory available is not known here: one model at a time" if free is None else
                     f"{need / 2**20:.0f} MiB needed, {free / 2**20:.0f} MiB available")
            old.close()
        log.info("loading %s (%s%s)", model_id, offer.target,
                 f", draft {offer.draft}" if offer.draft else "")
        try:
            engine = self._load(offer)
        except Exception as exc:
            if not self._engines:
                raise
            # memory that MemAvailable does not show (a GPU's) may be what ran out: try alone
            log.info("loading %s failed (%s) with %d other models loaded: unloading them and trying "
                     "again", model_id, exc, len(self._engines))
            while self._engines:
                self._engines.popitem(last=False)[1].close()
            engine = self._load(offer)
        self._engines[key] = engine
        return engine

    def _load(self, offer: Offer) -> Engine:
        assert self._make is not None
        engine = self._make(offer)
        try:
            engine.load()
        except Exception:
            engine.close()
            raise
        return engine

    def close(self) -> None:
        for engine in self._engines.values():
            engine.close()
        self._engines.clear()
