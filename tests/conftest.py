"""Suite-wide test configuration: marks `slow` the tests listed in
tests/support/costs.py (files whose owners are rewriting them now)."""
from __future__ import annotations

import pytest

from tests.support.costs import SLOW_ELSEWHERE, is_listed


def pytest_collection_modifyitems(config, items):
    for item in items:
        if any(is_listed(item.nodeid, entry) for entry in SLOW_ELSEWHERE):
            item.add_marker(pytest.mark.slow)
