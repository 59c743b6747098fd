"""Fixtures of the worker tests (helpers live in tests/support/workers.py)."""
import pytest

from tests.support.workers import make_cfg


@pytest.fixture
def cfg():
    return make_cfg()


@pytest.fixture(scope="module")
def actor_module():
    from hybridflow.workers import ActorWorker
    return ActorWorker(make_cfg())
