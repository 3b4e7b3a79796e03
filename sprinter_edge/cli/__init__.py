"""The `sprinter-edge` command line. Each subcommand lives in its own module."""

from __future__ import annotations

import argparse
import errno
import importlib
import sys
from pathlib import Path

from .. import __version__
from ..errors import SprinterError
from .common import setup_logging
from .extras import from_import_error

# module name -> registers one or more subcommands
SUBCOMMANDS = ("generate", "chat", "serve", "bench", "verifier", "models")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sprinter-edge",
        description="Faster local LLM generation: speculative decoding and SPRINTER "
                    "(a tiny learned verifier) over llama.cpp GGUF model pairs.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument("-v", "--verbose", action="count", default=0,
                        help="more logging (-v info, -vv debug including llama.cpp)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in SUBCOMMANDS:
        try:
            module = importlib.import_module(f"{__name__}.{name}")
        except ModuleNotFoundError as exc:
            if exc.name and exc.name.startswith(__name__):
                continue  # subcommand not built yet
            raise
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    setup_logging(args.verbose)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except SprinterError as exc:
        print(f"sprinter-edge: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except ImportError as exc:  # an optional dependency a subcommand did not check up front
        error = from_import_error(exc)
        if error is None:
            raise
        print(f"sprinter-edge: error: {error}", file=sys.stderr)
        return error.exit_code
    except BrokenPipeError:  # (an OSError: before the clause below)
        return 0
    except OSError as exc:  # a full disk that no writer turned into a DiskError
        if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        from ..catalog.store import disk_error
        from ..resources import cache_dir

        error = disk_error(Path(exc.filename) if exc.filename else cache_dir(), exc, None)
        print(f"sprinter-edge: error: {error}", file=sys.stderr)
        return error.exit_code
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
