"""Suite-wide fixtures: the one Ray session of a test module, and the runtime a
test runs on when it runs on both."""
from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def ray_session():
    """One Ray session per test module (8 CPUs, 4 logical GPUs on the CPU); the fake
    roles of tests/support/runtime_fakes.py are shipped to the workers by value."""
    import ray
    from ray import cloudpickle

    from tests.support import runtime_fakes
    cloudpickle.register_pickle_by_value(runtime_fakes)
    if ray.is_initialized():
        ray.shutdown()
    ray.init(num_cpus=8, num_gpus=4, include_dashboard=False)
    yield
    ray.shutdown()


@pytest.fixture(params=["local", pytest.param("ray", marks=[pytest.mark.ray, pytest.mark.slow])])
def runtime_name(request):
    """A test that takes this runs once per runtime: `local` in the fast tier, `ray`
    in the slow one, inside its module's Ray session."""
    if request.param == "ray":
        request.getfixturevalue("ray_session")
    return request.param
