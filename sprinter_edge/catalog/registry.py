"""The model/pair registry shipped in models/pairs.toml."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from ..errors import RegistryError
from ..resources import models_dir


@dataclass(frozen=True)
class Mirror:
    """An offline copy on PyPI: raw byte chunks in packages, concatenated in order."""

    version: str
    packages: tuple[str, ...]


@dataclass(frozen=True)
class ModelSpec:
    name: str
    repo: str
    file: str
    revision: str = "main"
    size: int | None = None
    sha256: str | None = None
    license: str = "unknown"
    verified: bool = False
    mirror: Mirror | None = None


@dataclass(frozen=True)
class PairSpec:
    name: str
    draft: ModelSpec
    target: ModelSpec
    tokenizer: str
    description: str = ""
    verifier: str | None = None  # path relative to models/
    is_default: bool = False
    extra: dict[str, str] = field(default_factory=dict)

    def verifier_path(self) -> Path | None:
        if not self.verifier:
            return None
        path = Path(self.verifier).expanduser()
        return path if path.is_absolute() else models_dir() / path


@dataclass(frozen=True)
class Registry:
    models: dict[str, ModelSpec]
    pairs: dict[str, PairSpec]
    default_pair: str

    def pair(self, name: str | None) -> PairSpec:
        key = self.default_pair if name in (None, "default") else name
        try:
            return self.pairs[key]
        except KeyError:
            known = ", ".join(sorted(self.pairs))
            raise RegistryError(f"unknown pair {name!r}; known pairs: default, {known}") from None


def parse_registry(data: dict) -> Registry:
    try:
        models: dict[str, ModelSpec] = {}
        for name, m in data.get("models", {}).items():
            mirror = m.get("mirror")
            models[name] = ModelSpec(
                name=name,
                repo=m["repo"],
                file=m["file"],
                revision=m.get("revision", "main"),
                size=m.get("size"),
                sha256=m.get("sha256"),
                license=m.get("license", "unknown"),
                verified=bool(m.get("verified", False)),
                mirror=Mirror(mirror["version"], tuple(mirror["packages"])) if mirror else None,
            )
        default = data["default_pair"]
        pairs: dict[str, PairSpec] = {}
        for name, p in data.get("pairs", {}).items():
            for role in ("draft", "target"):
                if p[role] not in models:
                    raise RegistryError(f"pair {name!r}: unknown {role} model {p[role]!r}")
            pairs[name] = PairSpec(
                name=name,
                draft=models[p["draft"]],
                target=models[p["target"]],
                tokenizer=p.get("tokenizer", "unknown"),
                description=p.get("description", ""),
                verifier=p.get("verifier"),
                is_default=name == default,
            )
    except KeyError as exc:
        raise RegistryError(f"malformed registry: missing key {exc}") from None
    if default not in pairs:
        raise RegistryError(f"malformed registry: default pair {default!r} is not defined")
    return Registry(models=models, pairs=pairs, default_pair=default)


def registry_path() -> Path:
    """models/pairs.toml, or the file named by SPRINTER_EDGE_REGISTRY (a private registry)."""
    env = os.environ.get("SPRINTER_EDGE_REGISTRY")
    return Path(env).expanduser() if env else models_dir() / "pairs.toml"


@lru_cache(maxsize=1)
def load_registry() -> Registry:
    path = registry_path()
    try:
        with path.open("rb") as fh:
            return parse_registry(tomllib.load(fh))
    except OSError as exc:
        raise RegistryError(f"cannot read the registry {path}: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise RegistryError(f"malformed registry {path}: {exc}") from None
