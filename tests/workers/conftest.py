"""Fixtures for the worker tests; the helpers live in tests/support/workers.py."""
import pytest

from tests.support.workers import (PROMPTS, TINY, empty_like, make_cfg,  # noqa: F401
                                   prompt_batch, rollout_for_update)


@pytest.fixture
def cfg():
    return make_cfg()


@pytest.fixture(scope="module")
def actor_module():
    from hybridflow.workers import ActorWorker
    return ActorWorker(make_cfg())
