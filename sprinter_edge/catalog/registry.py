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


# llama.cpp type names -> (llama_ftype of a whole file, ggml_type of one tensor), the integer
# constants of llama.h / ggml.h (LLAMA_FTYPE_MOSTLY_<name>, GGML_TYPE_<name>; checked against
# llama_cpp's in the tests). None: not that sort of type (Q4_K_M is a mix of tensor types for
# a file, Q4_K one tensor type). Types that need an importance matrix (IQ*) are left out.
QUANT_TYPES: dict[str, tuple[int | None, int | None]] = {
    "F32": (0, 0),
    "F16": (1, 1),
    "Q4_0": (2, 2),
    "Q4_1": (3, 3),
    "Q5_0": (8, 6),
    "Q5_1": (9, 7),
    "Q8_0": (7, 8),
    "Q2_K": (10, 10),
    "Q3_K": (None, 11),
    "Q3_K_S": (11, None),
    "Q3_K_M": (12, None),
    "Q3_K_L": (13, None),
    "Q4_K": (None, 12),
    "Q4_K_S": (14, None),
    "Q4_K_M": (15, None),
    "Q5_K": (None, 13),
    "Q5_K_S": (16, None),
    "Q5_K_M": (17, None),
    "Q6_K": (18, 14),
}


@dataclass(frozen=True)
class ModelSpec:
    name: str
    repo: str  # "" for a derived model (no Hub file)
    file: str
    revision: str = "main"
    size: int | None = None
    sha256: str | None = None
    license: str = "unknown"
    verified: bool = False
    mirror: Mirror | None = None
    derived: Derivation | None = None


@dataclass(frozen=True)
class Derivation:
    """A recipe: quantize `source` with llama.cpp (allow_requantize) to `ftype`, the output
    head (or the tied token embedding that serves as one) to `output_tensor_type`."""

    source: ModelSpec
    ftype: str
    output_tensor_type: str | None = None

    @property
    def llama_ftype(self) -> int:
        value = QUANT_TYPES[self.ftype][0]
        assert value is not None  # checked when parsing
        return value

    @property
    def ggml_output_type(self) -> int | None:
        return QUANT_TYPES[self.output_tensor_type][1] if self.output_tensor_type else None

    @property
    def recipe(self) -> str:
        """`Q4_0/head Q4_0`, or `Q4_0` when the head keeps llama.cpp's default type."""
        head = f"/head {self.output_tensor_type}" if self.output_tensor_type else ""
        return f"{self.ftype}{head}"

    def describe(self) -> str:
        return f"derived from {self.source.name} by {self.recipe}"


@dataclass(frozen=True)
class Acceptance:
    """How the pair's draft fares with its target, measured on-policy (priors for `auto`)."""

    sd_accept: float  # P(the target accepts a drafted token) in sd
    flagged_accept: float  # P(the target accepts a token SPRINTER sends it)
    flag_rate: dict[float, float]  # verifier threshold -> share of scored draft tokens flagged

    def flag_rate_at(self, threshold: float) -> float:
        nearest = min(self.flag_rate, key=lambda t: abs(t - threshold))
        return self.flag_rate[nearest]


def _parse_acceptance(pair: str, data: dict | None) -> Acceptance | None:
    if data is None:
        return None
    try:
        acc = Acceptance(float(data["sd_accept"]), float(data["flagged_accept"]),
                         {float(k): float(v) for k, v in data["flag_rate"].items()})
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise RegistryError(f"pair {pair!r}: malformed acceptance table ({exc}); it needs sd_accept, "
                            "flagged_accept and flag_rate = {threshold = rate, ...}") from None
    values = [acc.sd_accept, acc.flagged_accept, *acc.flag_rate.values()]
    if not acc.flag_rate or not all(0 <= v <= 1 for v in values):
        raise RegistryError(f"pair {pair!r}: acceptance rates must lie in [0, 1]")
    return acc


@dataclass(frozen=True)
class TaskLoss:
    """A SPRINTER preset's measured task-level loss against `ar`: pass-rate points (paired 95%
    interval) on `n` held-out problems of a benchmark."""

    points: float
    low: float
    high: float
    n: int

    def describe(self) -> str:
        return f"{self.points:+.1f} points [{self.low:+.1f}, {self.high:+.1f}] ({self.n})"


def _parse_task_quality(pair: str, data: dict | None) -> dict[str, dict[str, TaskLoss]]:
    """preset -> benchmark (humaneval | edits) -> its loss, from `[pairs.X.task_quality]`."""
    out: dict[str, dict[str, TaskLoss]] = {}
    for preset, benches in (data or {}).items():
        try:
            out[preset] = {b: TaskLoss(float(v[0]), float(v[1]), float(v[2]), int(v[3]))
                           for b, v in benches.items() if b != "source"}
        except (TypeError, ValueError, IndexError, AttributeError) as exc:
            raise RegistryError(f"pair {pair!r}: malformed task_quality for {preset!r} ({exc}); "
                                "each benchmark needs [points, low, high, n]") from None
    return out


@dataclass(frozen=True)
class PairSpec:
    name: str
    draft: ModelSpec
    target: ModelSpec
    tokenizer: str
    description: str = ""
    verifier: str | None = None  # path relative to models/
    is_default: bool = False
    acceptance: Acceptance | None = None
    # SPRINTER presets' measured pass-rate loss vs ar per benchmark (what a preset may promise)
    task_quality: dict[str, dict[str, TaskLoss]] = field(default_factory=dict)
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


DERIVED_KEYS = ("from", "ftype", "output_tensor_type")


def _derived_spec(name: str, m: dict, source: ModelSpec) -> ModelSpec:
    recipe = m["derived"]
    if not isinstance(recipe, dict):
        raise RegistryError(f"model {name!r}: derived must be a table "
                            '{ from = "<model>", ftype = "<type>", output_tensor_type = "<type>" }')
    unknown = sorted(set(recipe) - set(DERIVED_KEYS))
    if unknown:
        raise RegistryError(f"model {name!r}: unknown key(s) {', '.join(unknown)} in derived "
                            f"(known: {', '.join(DERIVED_KEYS)})")
    for key in ("repo", "mirror"):
        if key in m:
            raise RegistryError(f"model {name!r} is derived: it has no {key}")
    if not m.get("sha256"):
        raise RegistryError(f"model {name!r} is derived: it needs the sha256 the recipe must "
                            "produce (checked after deriving)")
    file_types = sorted(k for k, (ftype, _) in QUANT_TYPES.items() if ftype is not None)
    tensor_types = sorted(k for k, (_, gtype) in QUANT_TYPES.items() if gtype is not None)
    ftype = recipe.get("ftype")
    if ftype not in file_types:
        raise RegistryError(f"model {name!r}: unknown ftype {ftype!r} in derived "
                            f"(llama.cpp file types: {', '.join(file_types)})")
    head = recipe.get("output_tensor_type")
    if head is not None and head not in tensor_types:
        raise RegistryError(f"model {name!r}: unknown output_tensor_type {head!r} in derived "
                            f"(llama.cpp tensor types: {', '.join(tensor_types)})")
    return ModelSpec(
        name=name,
        repo="",
        file=m.get("file", f"{name}.gguf"),
        size=m.get("size"),
        sha256=m["sha256"],
        license=m.get("license", source.license),
        verified=bool(m.get("verified", False)),
        derived=Derivation(source=source, ftype=ftype, output_tensor_type=head),
    )


def _parse_models(raw: dict[str, dict]) -> dict[str, ModelSpec]:
    """Every model; a derived one after its source (recipes may chain, never in a cycle)."""
    models: dict[str, ModelSpec] = {}

    def build(name: str, chain: tuple[str, ...]) -> ModelSpec:
        if name in models:
            return models[name]
        m = raw[name]
        if "derived" in m:
            recipe = m["derived"]
            source = recipe.get("from") if isinstance(recipe, dict) else None
            if source is None:
                raise RegistryError(f'model {name!r}: derived needs from = "<model name>"')
            if source not in raw:
                known = ", ".join(sorted(raw))
                raise RegistryError(f"model {name!r} is derived from unknown model {source!r} "
                                    f"(known models: {known})")
            if source in chain:
                raise RegistryError(f"model {name!r}: derived models form a cycle: "
                                    + " <- ".join((*chain, name, source)))
            models[name] = _derived_spec(name, m, build(source, (*chain, name)))
            return models[name]
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
        return models[name]

    for name in raw:
        build(name, ())
    return {name: models[name] for name in raw}


def parse_registry(data: dict) -> Registry:
    try:
        models = _parse_models(data.get("models", {}))
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
                acceptance=_parse_acceptance(name, p.get("acceptance")),
                task_quality=_parse_task_quality(name, p.get("task_quality")),
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
