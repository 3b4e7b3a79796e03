"""The package as a user installs it: the built wheel in a fresh virtual environment, with only
its own dependencies (no scikit-learn, no skl2onnx: they are the `train` extra), runs `generate`
on the fixture model and has the server. llama-cpp-python comes from the wheel tools/setup.sh
built (PyPI ships only its source, a compile of minutes); the rest from the package index."""

from __future__ import annotations

import importlib.metadata
import json
import subprocess
import sys
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# slow: a wheel, a fresh venv and an install from the package index; its steps' own timeouts
# add up to more than the suite's per-test 900 s, so they, not the suite's, say which step hung
pytestmark = [pytest.mark.slow, pytest.mark.timeout(2400)]


def _llama_wheel() -> str:
    url = json.loads(importlib.metadata.distribution("llama-cpp-python").read_text("direct_url.json") or "{}")
    url = url.get("url", "")
    if not url.startswith("file://") or not url.endswith(".whl"):
        pytest.fail(f"llama-cpp-python was not installed from a local wheel ({url or 'an index'}): "
                    "run tools/setup.sh")
    return url.removeprefix("file://")


def test_the_wheel_runs_in_a_fresh_venv(tmp_path: Path, fixture_target_path: Path) -> None:
    dist = tmp_path / "dist"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                    "-w", str(dist), str(ROOT)], check=True, timeout=600)
    (wheel,) = dist.glob("sprinter_edge-*.whl")
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    python, cli = env_dir / "bin" / "python", env_dir / "bin" / "sprinter-edge"
    subprocess.run([str(python), "-m", "pip", "install", "-q", "--progress-bar", "off", _llama_wheel(),
                    str(wheel)], check=True, timeout=900)
    for module in ("sklearn", "skl2onnx"):  # training's, not the runtime's
        r = subprocess.run([str(python), "-c", f"import {module}"], capture_output=True, timeout=60)
        assert r.returncode != 0, f"{module} came with the plain install"
    r = subprocess.run([str(cli), "generate", "Say hello.", "--target", str(fixture_target_path), "--method",
                        "ar", "--max-tokens", "8", "--threads", "1", "--json"],
                       capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["text"].strip()
    r = subprocess.run([str(cli), "serve", "--help"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "--max-tokens" in r.stdout, r.stderr
