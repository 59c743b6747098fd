"""Suite-wide fixtures: the one Ray session of a test module, the runtime a test
runs on when it runs on both, the training runs several modules share; and the
suite's own Ray temp folder.

Ray's temp folder. `ray.init()` without an address joins the cluster named in
`<RAY_TMPDIR or /tmp>/ray/ray_current_cluster`, which `ray.cluster_utils.Cluster`
writes (tests/runtime/test_ray_cluster.py, tests/e2e/test_address_ray.py) while it
lives: any other suite, xdist worker or user on the machine that starts Ray then
would join that cluster and fail ("num_cpus and num_gpus must not be provided"). So
each test process (each xdist worker, or the one serial process) and the runs it
starts in subprocesses use a temp folder of their own (under RAY_TMPDIR if set),
removed at the end.

State: `os.environ["RAY_TMPDIR"]` for the session; the folder it names.
"""
from __future__ import annotations

import os
import shutil
import tempfile

import pytest

_OWN_RAY_TMPDIR: list[str] = []  # the folder this process made, removed at the end


def pytest_configure(config):
    if getattr(config.option, "numprocesses", None) and not hasattr(config, "workerinput"):
        return  # xdist's controller: it runs no test, and its workers make their own
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    # under the one the user chose, if any; short: Ray's socket paths below it must
    # stay under the 107-byte AF_UNIX limit
    folder = tempfile.mkdtemp(prefix=f"hf-ray-{worker}-", dir=os.environ.get("RAY_TMPDIR", "/tmp"))
    os.environ["RAY_TMPDIR"] = folder
    _OWN_RAY_TMPDIR.append(folder)


def pytest_unconfigure(config):
    for folder in _OWN_RAY_TMPDIR:
        shutil.rmtree(folder, ignore_errors=True)


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
    from hybridflow.runtime.ray.session import workers_at_driver_priority
    # address="local": a Ray of its own, never one a file in the temp folder names;
    # its workers at nice 0, as a run's own Ray (session.py: at Ray's nice 15 they
    # starved behind the other test process)
    with workers_at_driver_priority():
        ray.init(address="local", num_cpus=8, num_gpus=4, include_dashboard=False)
    yield
    ray.shutdown()


@pytest.fixture(scope="session")
def shared_runs(tmp_path_factory):
    """Training runs trained once per test process for the tests of several modules
    (tests/support/e2e.py SharedRuns)."""
    from tests.support.e2e import SharedRuns
    return SharedRuns(tmp_path_factory.mktemp("shared_runs"))


@pytest.fixture(params=["local", pytest.param("ray", marks=[pytest.mark.ray, pytest.mark.slow])])
def runtime_name(request):
    """A test that takes this runs once per runtime: `local` in the fast tier, `ray`
    in the slow one, inside its module's Ray session."""
    if request.param == "ray":
        request.getfixturevalue("ray_session")
    return request.param
