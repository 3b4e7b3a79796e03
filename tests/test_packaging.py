"""The wheel carries models/ (registry and shipped verifiers) and works outside the checkout."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.slow  # builds the wheel and pip-installs it


def test_wheel_ships_models_and_runs_from_elsewhere(tmp_path: Path) -> None:
    wheels = tmp_path / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                    "-w", str(wheels), str(ROOT)], check=True, timeout=300)
    (wheel,) = wheels.glob("sprinter_edge-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "sprinter_edge/_models/pairs.toml" in names
    shipped = [n for n in names if n.startswith("sprinter_edge/_models/verifiers/") and n.endswith(".onnx")]
    assert shipped
    assert "sprinter_edge/training/prompts.jsonl" in names

    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(site),
                    str(wheel)], check=True, timeout=300)
    probe = (
        "import sprinter_edge, sprinter_edge.resources as r;"
        "from sprinter_edge.catalog.registry import load_registry;"
        "from sprinter_edge.verifiers.onnx import OnnxVerifier;"
        "pair = load_registry().pair('default');"
        "v = OnnxVerifier(pair.verifier_path());"
        "print(sprinter_edge.__file__); print(r.models_dir()); print(v.default_threshold)"
    )
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {**os.environ, "PYTHONPATH": str(site)}
    out = subprocess.run([sys.executable, "-c", probe], cwd=elsewhere, env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    module_file, models_dir, _ = out.stdout.splitlines()
    assert module_file.startswith(str(site)) and models_dir.startswith(str(site))
