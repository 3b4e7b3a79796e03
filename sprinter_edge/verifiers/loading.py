"""Choosing the verifier SPRINTER uses: by name, by file, or the pair's shipped one."""

from __future__ import annotations

import logging
from pathlib import Path

from ..errors import VerifierError
from .base import Verifier
from .simple import AlwaysFlag, Confidence, NeverFlag

log = logging.getLogger(__name__)

BUILTIN = {"always-flag": AlwaysFlag, "never-flag": NeverFlag, "confidence": Confidence}


def resolve_verifier(spec: str | Verifier, pair: object, draft: object, target: object) -> Verifier:
    """`auto`: the pair's trained ONNX verifier if one ships, else the confidence rule;
    `hidden`: the pair's hidden-state option (the file beside it named <stem>-hidden.onnx)."""
    if isinstance(spec, Verifier):
        spec.check_pair(draft, target)
        return spec
    if spec in BUILTIN:
        return BUILTIN[spec]()
    if spec == "auto":
        path = pair.verifier_path() if pair is not None else None  # type: ignore[attr-defined]
        if path is not None and path.exists():
            return _load_onnx(path, draft, target)
        log.warning(
            "no trained verifier for this pair: SPRINTER uses the draft-confidence rule "
            "(train one with `sprinter-edge verifier train`)"
        )
        return Confidence()
    if spec == "hidden":
        path = pair.verifier_path() if pair is not None else None  # type: ignore[attr-defined]
        hidden = path.with_name(f"{path.stem}-hidden.onnx") if path is not None else None
        if hidden is None or not hidden.exists():
            raise VerifierError("this pair ships no hidden-state verifier (--verifier hidden); "
                                "train one with `sprinter-edge verifier study --ship`")
        return _load_onnx(hidden, draft, target)
    path = Path(spec)
    if path.suffix == ".onnx" or path.exists():
        return _load_onnx(path, draft, target)
    raise VerifierError(
        f"unknown verifier {spec!r}: use auto, hidden, {', '.join(BUILTIN)} or a path to an .onnx file"
    )


def _load_onnx(path: Path, draft: object, target: object) -> Verifier:
    from .onnx import OnnxVerifier

    verifier = OnnxVerifier(path)
    verifier.check_pair(draft, target)
    return verifier
