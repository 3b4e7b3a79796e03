"""The registry of decoding methods: name -> strategy class, filled by `decoding/__init__.py`
(a new method is its file and a line there). It sits below the modules that read it when they
run (the context's settings, the counters' names), so reading it makes no import circle."""

from __future__ import annotations

from typing import Any

from .settings import Setting, declared

STRATEGIES: dict[str, type[Any]] = {}


def all_settings() -> dict[str, Setting]:
    """Every registered method's settings, by name (read when called: a method registered
    later brings its own)."""
    return declared(STRATEGIES.values())


def declared_counters() -> tuple[str, ...]:
    """The counters the registered methods keep of their own (`Strategy.counters`)."""
    return tuple(dict.fromkeys(c for cls in STRATEGIES.values() for c in cls.counters))
