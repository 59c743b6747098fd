"""One Ray session per test module (4 logical GPUs on the CPU); the fake roles are
shipped to the workers by value."""
from __future__ import annotations

import pytest
from ray import cloudpickle

from tests.support import runtime_fakes


@pytest.fixture(scope="module")
def ray_session():
    import ray
    cloudpickle.register_pickle_by_value(runtime_fakes)
    if ray.is_initialized():
        ray.shutdown()
    ray.init(num_cpus=8, num_gpus=4, include_dashboard=False)
    yield
    ray.shutdown()
