"""User-facing errors: each carries one clear message and the CLI's exit code."""

from __future__ import annotations


class SprinterError(Exception):
    """Base class: the CLI prints the message (no traceback) and exits with `exit_code`."""

    exit_code = 1


class SettingsError(SprinterError, ValueError):
    """A generation or decoding setting is out of range (a usage error)."""

    exit_code = 2


class ModelFileError(SprinterError):
    """A model file is missing, not GGUF, truncated or fails its checksum."""

    exit_code = 3


class ChecksumError(ModelFileError):
    pass


class TokenizerMismatchError(SprinterError):
    """Draft and target do not share one tokenizer."""

    exit_code = 4


class RegistryError(SprinterError):
    """Unknown pair or model name, or a malformed registry."""

    exit_code = 2


class DownloadError(SprinterError):
    """A download failed or the network / Hub is not reachable."""

    exit_code = 5


class ContextOverflowError(SprinterError):
    """The prompt (plus the generation budget) does not fit in the context window."""

    exit_code = 6


class VerifierError(SprinterError):
    """A verifier file is missing, corrupt, or was trained for another pair or layout."""

    exit_code = 7


class BackendError(SprinterError):
    """llama.cpp refused an operation (decode failure, cannot create a context, ...)."""

    exit_code = 8


class TargetLostError(BackendError):
    """The target's rpc-server went away mid-use, or never answered as one (`at_load`;
    backend/rpc.py): this process cannot use it again."""

    exit_code = 10

    def __init__(self, message: str, *, at_load: bool = False):
        super().__init__(message)
        self.at_load = at_load


class EngineStoppedError(BackendError):
    """The server's engine process stopped (an abort inside llama.cpp, a kill, its target lost) or
    is loading again after one (serving/supervisor.py): the server answers 503 meanwhile."""


class DiskError(SprinterError):
    """The cache could not be written: the disk is full (or another OSError while writing)."""

    exit_code = 9


class GrammarError(SettingsError):
    """A structured-output constraint (JSON schema, regex, GBNF or Lark grammar) is invalid or
    uses what the grammar engine does not support (a usage error: the server answers 400)."""
