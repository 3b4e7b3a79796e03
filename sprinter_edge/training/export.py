"""Exporting a trained pipeline to ONNX with its contract in the model's metadata."""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
from sklearn.pipeline import Pipeline

from ..errors import SprinterError
from ..verifiers.calibration import PRESET_MAX_FP, CalibrationRow, table_to_json
from ..verifiers.onnx import FORMAT, OnnxVerifier

log = logging.getLogger(__name__)


@contextlib.contextmanager
def _bool_attributes_as_ints() -> Iterator[None]:
    """skl2onnx 1.20 puts numpy bools into integer attribute lists of tree ensembles
    (HistGradientBoosting), which current onnx rejects: cast them while converting."""
    import onnx.helper as helper

    original = helper.make_attribute

    def make_attribute(key: str, value: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(value, (list, tuple, np.ndarray)) and any(
                isinstance(v, (bool, np.bool_)) for v in value):
            value = [int(v) for v in value]
        return original(key, value, *args, **kwargs)

    helper.make_attribute = make_attribute
    try:
        yield
    finally:
        helper.make_attribute = original


def to_onnx(pipeline: Pipeline, n_features: int, *, double: bool = False) -> Any:
    """The pipeline as an ONNX model: input `features` [N, n_features], outputs `label` and
    `probabilities` [N, 2] (column 1 = P(accept))."""
    from skl2onnx import convert_sklearn
    from skl2onnx.common.data_types import DoubleTensorType, FloatTensorType

    clf = pipeline.steps[-1][1]
    tensor = DoubleTensorType if double else FloatTensorType
    with _bool_attributes_as_ints():
        return convert_sklearn(pipeline, initial_types=[("features", tensor([None, n_features]))],
                               options={id(clf): {"zipmap": False}},
                               target_opset={"": 17, "ai.onnx.ml": 3})


def export(pipeline: Pipeline, path: str | Path, *, layout: tuple[str, ...], n_features: int,
           pair: dict[str, Any], label_rule: str, default_threshold: float,
           presets: dict[str, float], table: list[CalibrationRow], metrics: dict[str, Any],
           tv_pq: float | None, extra: dict[str, str] | None = None, double: bool = False) -> Path:
    model = to_onnx(pipeline, n_features, double=double)
    props = {
        "sprinter.format": FORMAT,
        "sprinter.pair": json.dumps(pair),
        "sprinter.layout": json.dumps(list(layout)),
        "sprinter.label_rule": label_rule,
        "sprinter.default_threshold": f"{default_threshold:.6g}",
        "sprinter.presets": json.dumps(presets),
        "sprinter.preset_max_fp": json.dumps(PRESET_MAX_FP),
        "sprinter.calibration": json.dumps(table_to_json(table)),
        "sprinter.metrics": json.dumps(metrics, default=float),
        "sprinter.output": "probabilities[:, 1] = P(accept): P(label 1)",
    } | ({"sprinter.tv_pq": f"{tv_pq:.6g}"} if tv_pq is not None else {}) | (extra or {})
    for k, v in props.items():
        entry = model.metadata_props.add()
        entry.key, entry.value = k, v
    model.doc_string = "sprinter-edge SPRINTER verifier: P(the target accepts this draft token)"
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".onnx.tmp")
    tmp.write_bytes(model.SerializeToString())
    tmp.replace(out)
    log.info("wrote %s (%d bytes)", out, out.stat().st_size)
    return out


def parity(pipeline: Pipeline, path: str | Path, x: np.ndarray) -> float:
    """Max |sklearn - onnxruntime| of P(accept) over rows x."""
    if len(x) == 0:
        raise SprinterError("no rows to check parity on")
    ver = OnnxVerifier(path)
    ref = pipeline.predict_proba(x.astype(np.float32))[:, 1]
    got = ver.score_matrix(x)
    return float(np.max(np.abs(ref - got)))
