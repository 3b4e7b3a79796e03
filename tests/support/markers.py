"""The fast suite (-m "not integration and not slow") loads the fixture pair only: a test that
uses the default pair must be marked `integration`, or the suite refuses to collect it."""

from __future__ import annotations

from collections.abc import Iterable

import pytest

# the fixtures that load the real default pair (tests/conftest.py)
DEFAULT_PAIR_FIXTURES = ("default_pair_paths", "default_engine")


def check_default_pair_marks(items: Iterable[pytest.Item]) -> None:
    """A usage error naming every test that uses a default-pair fixture, directly or through
    another fixture, without @pytest.mark.integration."""
    unmarked = [item.nodeid for item in items
                if set(DEFAULT_PAIR_FIXTURES) & set(getattr(item, "fixturenames", ()))
                and item.get_closest_marker("integration") is None]
    if unmarked:
        raise pytest.UsageError(
            f"these tests load the default pair ({', '.join(DEFAULT_PAIR_FIXTURES)}) without "
            "@pytest.mark.integration, so the fast suite would load it too:\n  " + "\n  ".join(unmarked))
