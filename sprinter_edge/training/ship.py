"""Train on collected data and export the verifier: the `verifier train` workflow."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from ..errors import SprinterError
from .collect import load_data
from .export import export, parity
from .train import TrainConfig, TrainResult, train

log = logging.getLogger(__name__)

PARITY_TOLERANCE = 1e-5


def train_and_export(data_dir: str | Path, out: str | Path, cfg: TrainConfig | None = None,
                     *, pair_name: str | None = None) -> tuple[TrainResult, dict[str, Any]]:
    data, meta = load_data(data_dir)
    result = train(data, cfg)
    pair = dict(meta["pair"])  # type: ignore[arg-type]
    if pair_name:
        pair["name"] = pair_name
    n_features = result.test_x.shape[1]
    metrics = {k: result.report[k] for k in ("label", "split", "chosen", "shipped_test",
                                             "confidence_test", "tv_pq_test_mean")}
    metrics["candidates_test_auc"] = {n: r["test"]["auc"] for n, r in result.report["candidates"].items()}
    common = dict(layout=result.chosen.layout, n_features=n_features, pair=pair,
                  label_rule=result.label, default_threshold=result.default_threshold,
                  presets=result.presets, table=result.table, metrics=metrics, tv_pq=result.tv_pq,
                  extra={"sprinter.model": result.chosen.name,
                         "sprinter.corpus": json.dumps({"name": meta.get("corpus"),
                                                        "digest": meta.get("corpus_digest")})})
    path = export(result.pipeline, out, **common)  # type: ignore[arg-type]
    diff = parity(result.pipeline, path, result.test_x)
    if diff > PARITY_TOLERANCE:
        log.info("float32 ONNX differs from sklearn by %.2g: exporting in float64", diff)
        path = export(result.pipeline, out, double=True, **common)  # type: ignore[arg-type]
        diff = parity(result.pipeline, path, result.test_x)
    if diff > PARITY_TOLERANCE:
        raise SprinterError(f"ONNX export disagrees with scikit-learn by {diff:.2g} (> {PARITY_TOLERANCE})")
    result.report["onnx_parity_max_abs_diff"] = diff
    result.report["onnx_bytes"] = Path(path).stat().st_size
    return result, result.report
