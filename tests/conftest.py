"""Suite-wide fixtures: the Ray session of test modules (shared by consecutive ones),
the runtime a test runs on when it runs on both, the training runs several modules
share; and the suite's own Ray temp folder.

Ray's temp folder. `ray.init()` without an address joins the cluster named in
`<RAY_TMPDIR or /tmp>/ray/ray_current_cluster`, which `ray.cluster_utils.Cluster`
writes (tests/runtime/test_ray_cluster.py, tests/e2e/test_address_ray.py) while it
lives: any other suite, xdist worker or user on the machine that starts Ray then
would join that cluster and fail ("num_cpus and num_gpus must not be provided"). So
each test process (each xdist worker, or the one serial process) and the runs it
starts in subprocesses use a temp folder of their own (under RAY_TMPDIR if set),
removed at the end.

State: `os.environ["RAY_TMPDIR"]` for the session; the folder it names; whether the
shared Ray session is up (`_SHARED_RAY`).
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
    if _SHARED_RAY:
        _stop_shared_ray()
    for folder in _OWN_RAY_TMPDIR:
        shutil.rmtree(folder, ignore_errors=True)


_SHARED_RAY: list[bool] = []  # [True] while the Ray `ray_session` started is up


@pytest.fixture(scope="module")
def ray_session():
    """A Ray session for the module (8 CPUs, 4 logical GPUs on the CPU), shared with the
    next module that asks for one in this process: a start and a shutdown cost ~5 s
    and ~5 CPU-seconds of Ray's own processes each. It is left up only when the
    module gave every CPU and GPU back (its actors and placement groups gone), and
    stopped before a module that uses Ray without it (`_own_ray_where_asked`). The
    fake roles of tests/support/runtime_fakes.py are shipped to the workers by value."""
    import ray
    from ray import cloudpickle

    from tests.support import runtime_fakes
    cloudpickle.register_pickle_by_value(runtime_fakes)
    if ray.is_initialized() and not _SHARED_RAY:
        ray.shutdown()  # a Ray some test started for itself: not this one to share
    if not ray.is_initialized():
        from hybridflow.runtime.ray.session import workers_at_driver_priority
        # address="local": a Ray of its own, never one a file in the temp folder
        # names (nor does it write one: a subprocess's Ray never joins it); its
        # workers at nice 0, as a run's own Ray (at Ray's nice 15 they starved
        # behind the other test process)
        with workers_at_driver_priority():
            ray.init(address="local", num_cpus=8, num_gpus=4, include_dashboard=False)
        _SHARED_RAY[:] = [True]
    yield
    if not _all_given_back(ray):
        _stop_shared_ray()


def _all_given_back(ray, wait_s: float = 5.0) -> bool:
    """Every CPU and GPU of the session free again (within `wait_s`: Ray returns a
    killed actor's resources a moment later)."""
    import time
    if not ray.is_initialized():
        return False
    deadline = time.monotonic() + wait_s
    total = {k: v for k, v in ray.cluster_resources().items() if k in ("CPU", "GPU")}
    while True:
        free = ray.available_resources()
        if all(free.get(k, 0.0) >= v - 1e-6 for k, v in total.items()):
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)


def _stop_shared_ray() -> None:
    import ray
    if _SHARED_RAY and ray.is_initialized():
        ray.shutdown()
    _SHARED_RAY.clear()


def _wants_shared_ray(item) -> bool:
    params = getattr(getattr(item, "callspec", None), "params", {})
    return "ray_session" in item.fixturenames or params.get("runtime_name") == "ray"


@pytest.fixture(scope="module", autouse=True)
def _own_ray_where_asked(request):
    """A module that uses Ray (marked `ray`) but not `ray_session` starts, joins or
    checks Ray itself: it finds none running, as if each module had its own session."""
    if _SHARED_RAY:
        items = [i for i in request.session.items if i.module is request.module]
        if any(i.get_closest_marker("ray") for i in items) and \
                not any(_wants_shared_ray(i) for i in items):
            _stop_shared_ray()
    yield


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
