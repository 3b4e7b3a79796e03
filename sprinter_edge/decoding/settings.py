"""A method's own knobs, declared once in its strategy's file (`Strategy.settings`).

Each `Setting` becomes an `Engine` keyword (`Engine(..., draft_len=3)`), a CLI flag
(`--draft-len 3`, on every entry point that decodes), an entry of the server's `settings`
request field, a value in `DecodeContext.settings` for the reply, and a part of the label of
the plans `auto` runs (`sd(k=3)`). The registry of settings is read from the registered
strategies when it is used, so a method registered later brings its own.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import SettingsError


@dataclass(frozen=True)
class Setting:
    """One knob of a method."""

    name: str  # the keyword, the request field's key; the CLI flag is --name-with-dashes
    default: Any
    help: str  # one line, starting with the method it belongs to ("sd: ...")
    type: type = int  # int | float | bool
    minimum: float | None = None
    none_ok: bool = False  # None is a value (on the CLI: 0 means None)
    short: str | None = None  # its name in a plan's label (default: `name`)
    cli: bool = True  # a flag on the command line (False: API and server only)

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    def check(self, value: Any) -> Any:
        """`value` as this setting holds it; a SettingsError says what is wrong."""
        if value is None:
            if self.none_ok:
                return None
            raise SettingsError(f"{self.name} needs a value")
        if self.type is bool:
            if not isinstance(value, bool):
                raise SettingsError(f"{self.name} must be true or false, not {value!r}")
            return value
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise SettingsError(f"{self.name} must be a number, not {value!r}")
        if self.type is int and int(value) != value:
            raise SettingsError(f"{self.name} must be a whole number, not {value!r}")
        value = self.type(value)
        if self.minimum is not None and value < self.minimum:
            none = " (or None: none)" if self.none_ok else ""
            raise SettingsError(f"{self.name} must be >= {self.minimum:g}{none}, not {value}")
        return value


def declared(owners: Iterable[Any]) -> dict[str, Setting]:
    """The settings the strategy classes `owners` declare, by name. A name declared twice (a
    subclass inherits its parent's) must mean one thing."""
    out: dict[str, Setting] = {}
    for owner in owners:
        for s in owner.settings:
            if out.setdefault(s.name, s) != s:
                raise TypeError(f"setting {s.name!r} is declared twice with different meanings")
    return out


def resolve(known: Mapping[str, Setting], values: Mapping[str, Any]) -> dict[str, Any]:
    """Every known setting's value: `values` checked, the defaults elsewhere."""
    unknown = sorted(set(values) - set(known))
    if unknown:
        raise SettingsError(f"unknown setting {unknown[0]!r}; the methods here have: "
                            f"{', '.join(sorted(known)) or 'none'}")
    return {name: s.check(values[name]) if name in values else s.default for name, s in known.items()}
