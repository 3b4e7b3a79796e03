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
    path, diff = _export_checked(result.pipeline, out, result.test_x, common)
    result.report["onnx_parity_max_abs_diff"] = diff
    result.report["onnx_bytes"] = Path(path).stat().st_size
    return result, result.report


def _export_checked(pipeline: Any, out: str | Path, x: Any, common: dict[str, Any]) -> tuple[Path, float]:
    """Export, check ONNX against scikit-learn on rows x; float64 when float32 is not close
    enough; an error when neither is."""
    path = export(pipeline, out, **common)
    diff = parity(pipeline, path, x)
    if diff > PARITY_TOLERANCE:
        log.info("float32 ONNX differs from sklearn by %.2g: exporting in float64", diff)
        path = export(pipeline, out, double=True, **common)
        diff = parity(pipeline, path, x)
    if diff > PARITY_TOLERANCE:
        raise SprinterError(f"ONNX export disagrees with scikit-learn by {diff:.2g} (> {PARITY_TOLERANCE})")
    return path, diff


def ship_from_study(data: dict[str, Any], meta: dict[str, Any], name: str, out: str | Path, *,
                    seed: int = 0, cost: Any = None, cap: int | None = 16,
                    pair_name: str | None = None) -> dict[str, Any]:
    """Export one study candidate, fitted on the on-policy train groups (greedy rows), with
    presets per sampling regime and domain chosen on the calibration groups and checked on the
    test groups (`study.presets_by_domain`), and the greedy test rows' calibration table (for
    --max-fp-rate). Returns what was written, with the held-out checks."""
    import numpy as np

    from ..verifiers.calibration import calibration_table
    from . import study

    cand = study.candidate(name)
    if not cand.exportable:
        raise SprinterError(f"candidate {name!r} cannot be exported to ONNX")
    masks = study.split_by_group(data["group"], data["domain"], seed=seed)
    _, calib, test = masks
    pipe = study.fit_final(data, cand, masks, "greedy", seed=seed)
    x = study.matrix_of(data, cand.layout)
    scores = pipe.predict_proba(x)[:, 1]
    greedy = np.asarray(data["temperature"]) == 0
    checks: dict[str, Any] = {}
    domain_presets: dict[str, dict[str, dict[str, float]]] = {}
    for regime, rm in (("greedy", greedy), ("sampled", ~greedy)):
        if not (calib & rm).any():
            continue
        found = study.presets_by_domain(scores, data, calib & rm, test_mask=test & rm, cost=cost, cap=cap,
                                        n_boot=1000, seed=seed)
        checks[regime] = found
        domain_presets[regime] = {dom: {p: row["threshold"] for p, row in pts.items()
                                        if row["threshold"] is not None}
                                  for dom, pts in found.items() if dom != "all"}
    te = test & greedy
    label = np.asarray(data["label_greedy"])[te]
    table = calibration_table(scores[te], label, argmax_differs=label == 0)
    presets = {p: row["threshold"] for p, row in checks["greedy"]["all"].items()
               if row["threshold"] is not None}
    pair = dict(meta["pair"])
    if pair_name:
        pair["name"] = pair_name
    n_features = x.shape[1]
    common = dict(layout=cand.layout, n_features=n_features, pair=pair, label_rule="greedy",
                  default_threshold=presets.get("balanced", 0.5), presets=presets, table=table,
                  metrics={"study_candidate": name, "split": f"by prompt group, seed {seed}",
                           "preset_checks": checks},
                  tv_pq=float(np.mean(data["tv"][te])),
                  extra={"sprinter.model": name, "sprinter.domain_presets": json.dumps(domain_presets),
                         "sprinter.data": json.dumps({"format": meta.get("format"),
                                                      "behaviour": meta.get("behaviour"),
                                                      "temperatures": meta.get("config", {}).get(
                                                          "temperatures")})})
    path, diff = _export_checked(pipe, out, x[te][:2000], common)
    return {"file": str(path), "candidate": name, "presets": presets, "domain_presets": domain_presets,
            "checks": checks, "onnx_parity_max_abs_diff": diff, "onnx_bytes": Path(path).stat().st_size}
