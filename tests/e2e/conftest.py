"""One Ray session (8 CPUs, 4 logical GPUs) per e2e module that asks for it."""
import pytest


@pytest.fixture(scope="module")
def ray_session():
    import ray
    if ray.is_initialized():
        ray.shutdown()
    ray.init(num_cpus=8, num_gpus=4, include_dashboard=False)
    yield
    ray.shutdown()
