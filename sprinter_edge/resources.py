"""Where the package's data lives: models/ (in the wheel) and the user's cache."""

from __future__ import annotations

import os
import shlex
import sys
from functools import lru_cache
from pathlib import Path


@lru_cache(maxsize=1)
def models_dir() -> Path:
    """models/ from the installed wheel (sprinter_edge/_models) or from a checkout."""
    packaged = Path(__file__).resolve().parent / "_models"
    if (packaged / "pairs.toml").exists():
        return packaged
    checkout = Path(__file__).resolve().parent.parent / "models"
    if (checkout / "pairs.toml").exists():
        return checkout
    raise FileNotFoundError("sprinter-edge data folder models/ not found (broken install?)")


def cache_dir() -> Path:
    """Where assembled model files and other downloads go (SPRINTER_EDGE_HOME overrides)."""
    env = os.environ.get("SPRINTER_EDGE_HOME")
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "sprinter-edge"


def install_hint(extra: str) -> str:
    """The command that installs the package's `extra` into this Python: from the checkout it
    runs from where there is one (sprinter-edge installs from a clone, not from an index)."""
    root = Path(__file__).resolve().parent.parent
    python = shlex.quote(sys.executable)
    if (root / "pyproject.toml").is_file():
        return f"{python} -m pip install -e {shlex.quote(f'{root}[{extra}]')}"
    return f"{python} -m pip install '.[{extra}]' in the folder of your sprinter-edge clone"
