"""A learned verifier stored as ONNX, scored with onnxruntime on one CPU thread.

The file carries its own contract in the model's metadata (keys `sprinter.*`): the pair it
was trained for (draft and target fingerprints, the draft's hidden size), the feature
layout (names from `FEATURE_BLOCKS`), the label rule, the default threshold, presets and
the held-out calibration table. Loading checks all of it against the models in use.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import VerifierError
from .base import FEATURE_BLOCKS, DraftFeatures, Verifier, feature_vector
from .calibration import CalibrationRow, table_from_json

log = logging.getLogger(__name__)

FORMAT = "sprinter-edge-verifier-v1"
BAND = 1e-5  # max_prob_band's half-width: far beyond float32 rounding at max probability <= 1
REQUIRED = ("sprinter.format", "sprinter.pair", "sprinter.layout", "sprinter.label_rule",
            "sprinter.default_threshold")


def block_width(block: str, n_embd: int) -> int:
    return n_embd if block == "hidden" else 1


def session_options() -> Any:
    import onnxruntime as ort

    so = ort.SessionOptions()
    # One thread, no spinning: spinning threads steal the cores llama.cpp decodes on.
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    so.add_session_config_entry("session.inter_op.allow_spinning", "0")
    so.log_severity_level = 3
    return so


class OnnxVerifier(Verifier):
    """P(accept) from an exported scikit-learn pipeline."""

    def __init__(self, path: str | Path):
        import onnxruntime as ort

        self.path = Path(path)
        self.name = f"onnx:{self.path.name}"
        if not self.path.is_file():
            raise VerifierError(f"verifier file not found: {self.path}")
        try:
            self._session = ort.InferenceSession(str(self.path), sess_options=session_options(),
                                                 providers=["CPUExecutionProvider"])
        except Exception as exc:  # onnxruntime raises its own exception types
            raise VerifierError(f"cannot load verifier {self.path}: not a valid ONNX model "
                                f"({type(exc).__name__}: {str(exc)[:200]})") from exc
        meta = dict(self._session.get_modelmeta().custom_metadata_map)
        missing = [k for k in REQUIRED if k not in meta]
        if missing:
            raise VerifierError(f"{self.path} is not a sprinter-edge verifier "
                                f"(metadata {', '.join(missing)} missing)")
        if meta["sprinter.format"] != FORMAT:
            raise VerifierError(f"{self.path}: unsupported verifier format {meta['sprinter.format']!r}")
        try:
            self.pair: dict[str, Any] = json.loads(meta["sprinter.pair"])
            self.layout: tuple[str, ...] = tuple(json.loads(meta["sprinter.layout"]))
            self.default_threshold = float(meta["sprinter.default_threshold"])
            self.presets = {k: float(v) for k, v in json.loads(meta.get("sprinter.presets", "{}")).items()}
            self.domain_presets = {
                regime: {dom: {k: float(v) for k, v in pts.items()} for dom, pts in doms.items()}
                for regime, doms in json.loads(meta.get("sprinter.domain_presets", "{}")).items()}
            self.calibration: list[CalibrationRow] = table_from_json(
                json.loads(meta.get("sprinter.calibration", "[]")))
            self.metrics: dict[str, Any] = json.loads(meta.get("sprinter.metrics", "{}"))
            self.tv_pq: float | None = (float(meta["sprinter.tv_pq"]) if "sprinter.tv_pq" in meta
                                        else None)
        except (ValueError, TypeError, AttributeError) as exc:
            raise VerifierError(f"{self.path}: malformed verifier metadata ({exc})") from exc
        self.label_rule = meta["sprinter.label_rule"]
        self.metadata = meta
        unknown = [b for b in self.layout if b not in FEATURE_BLOCKS]
        if not self.layout or unknown:
            raise VerifierError(f"{self.path}: unknown feature blocks {unknown} "
                                f"(this version knows {', '.join(FEATURE_BLOCKS)})")
        self.needs_hidden = "hidden" in self.layout
        self.n_embd = int(self.pair.get("draft", {}).get("n_embd", 0))
        inp = self._session.get_inputs()[0]
        self._input = inp.name
        self._dtype = np.float64 if inp.type == "tensor(double)" else np.float32
        width = sum(block_width(b, self.n_embd) for b in self.layout)
        declared = inp.shape[1] if len(inp.shape) == 2 else None
        if isinstance(declared, int) and declared != width:
            raise VerifierError(f"{self.path}: the model reads {declared} features but its layout "
                                f"{list(self.layout)} with n_embd={self.n_embd} gives {width}")
        self.width = width
        self._grid: np.ndarray | None = None  # scores along max probability (_max_prob_grid)
        self._bands: dict[float, tuple[float, float]] = {}  # threshold -> max_prob_band
        outputs = [o.name for o in self._session.get_outputs()]
        self._output = "probabilities" if "probabilities" in outputs else outputs[-1]
        if not 0 < self.default_threshold <= 1:
            raise VerifierError(f"{self.path}: default threshold {self.default_threshold} not in (0, 1]")

    # ------------------------------------------------------------------ checks
    def check_pair(self, draft: object, target: object) -> None:
        want_d = self.pair.get("draft", {})
        want_t = self.pair.get("target", {})
        n_embd = getattr(draft, "n_embd", None)
        if self.needs_hidden and n_embd is not None and n_embd != self.n_embd:
            raise VerifierError(
                f"verifier {self.path.name} reads {self.n_embd}-d hidden states but the draft "
                f"{getattr(draft, 'path', draft)} has n_embd={n_embd}: it was trained for another "
                "draft model")
        for role, model, want in (("draft", draft, want_d), ("target", target, want_t)):
            fp = getattr(model, "fingerprint", None)
            if fp is None or not want.get("fingerprint"):
                continue
            got = fp()
            if got != want["fingerprint"]:
                raise VerifierError(
                    f"verifier {self.path.name} was trained for {role} {want.get('file', '?')} "
                    f"(fingerprint {want['fingerprint']}), not {getattr(model, 'path', model)} "
                    f"(fingerprint {got}); train one for this pair with `sprinter-edge verifier "
                    "collect` and `sprinter-edge verifier train`, or use --verifier confidence")

    def check_layout(self, layout: tuple[str, ...]) -> None:
        if tuple(layout) != self.layout:
            raise VerifierError(f"verifier {self.path.name} expects features {list(self.layout)}, "
                                f"not {list(layout)}")

    # ------------------------------------------------------------------ scoring
    def score(self, features: DraftFeatures) -> float:
        x = feature_vector(features, self.layout)
        if x.shape[0] != self.width:
            raise VerifierError(f"verifier {self.path.name} expects {self.width} features, got "
                                f"{x.shape[0]} (a hidden state of another size?)")
        return float(self.score_matrix(x[None, :])[0])

    def highest_score(self) -> float | None:
        """Known for a model of the draft's max probability alone (the shipped verifiers): its
        scores lie in a narrow band (0.956-0.977 for max prob 0.9-1), so a threshold a little
        too high flags everything."""
        grid = self._max_prob_grid()
        return None if grid is None else float(grid.max())

    def max_prob_band(self, threshold: float) -> tuple[float, float] | None:
        """For a model of the max probability alone that rises along it (the shipped logistic
        ones): the cut where it reaches `threshold`, found by bisection on the model itself,
        widened by BAND each way. Float32 rounding inside the model makes the decision jagged
        within ~1e-7 of the cut; the band leaves those tokens to the model."""
        grid = self._max_prob_grid()
        if grid is None or np.any(np.diff(grid) <= 0):
            return None
        if threshold not in self._bands:  # asked once per SPRINTER request

            def passes(m: float) -> bool:
                return float(self.score_matrix(np.array([[m]]))[0]) >= threshold

            lo, hi = 0.0, 1.0
            if not passes(hi):
                band = (2.0, 2.0)  # nothing passes
            elif passes(lo):
                band = (-1.0, -1.0)  # everything passes
            else:
                for _ in range(60):  # invariant: lo fails, hi passes
                    mid = (lo + hi) / 2
                    lo, hi = (lo, mid) if passes(mid) else (mid, hi)
                band = (hi - BAND, hi + BAND)
            self._bands[threshold] = band
        return self._bands[threshold]

    def _max_prob_grid(self) -> np.ndarray | None:
        """Scores at max probability 0, 0.001, ..., 1 (one ONNX run per file), for a model of
        the max probability alone; None for any other layout."""
        if self.layout != ("max_prob",):
            return None
        if self._grid is None:
            self._grid = self.score_matrix(np.linspace(0.0, 1.0, 1001)[:, None])
        return self._grid

    def score_matrix(self, x: np.ndarray) -> np.ndarray:
        """P(accept) for rows of features laid out as `self.layout`."""
        x = np.ascontiguousarray(x, dtype=self._dtype)
        out = self._session.run([self._output], {self._input: x})[0]
        out = np.asarray(out)
        return out[:, 1] if out.ndim == 2 else out
