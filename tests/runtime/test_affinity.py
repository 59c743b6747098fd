"""`placement.pools.<name>.cores`: a pool's workers run on the cores it lists (each
worker of a node on its slice, every thread of it), a core the worker may not use is
refused naming the key, a count that does not divide among a node's devices is refused
before launch, and the local runtime says the key does nothing there."""
from __future__ import annotations

import os

import pytest

from hybridflow.core.constraints import ConfigError
from hybridflow.plan.placement import Placement
from hybridflow.program.applicability import check_applicable
from hybridflow.program.config import build_config
from hybridflow.runtime.affinity import cores_for, pin_process

CORES = sorted(os.sched_getaffinity(0))


def test_each_worker_of_a_node_gets_an_equal_slice_in_local_rank_order():
    assert [cores_for((4, 5, 6, 7), 2, rank) for rank in (0, 1)] == [(4, 5), (6, 7)]
    assert cores_for((3,), 1, 0) == (3,)


def test_a_core_this_process_may_not_use_is_refused_naming_the_key():
    with pytest.raises(ValueError) as err:
        pin_process((CORES[0], 4096), "placement.pools.gen.cores", None)
    assert str(err.value).startswith(f"placement.pools.gen.cores=[{CORES[0]}, 4096]: "
                                     f"core(s) [4096] are not among the cores")
    assert sorted(os.sched_getaffinity(0)) == CORES  # refused before anything moved


def test_a_count_that_does_not_divide_among_the_devices_is_refused():
    with pytest.raises(ValueError, match=r"placement.pools.p.cores lists 3 core\(s\) for "
                                         r"devices_per_node=2: list a multiple of it"):
        Placement.from_config({"pools": {"p": {"devices_per_node": 2, "cores": [0, 1, 2]}}})
    with pytest.raises(ConfigError, match=r"placement.pools.gen.cores must be a non-empty "
                                          r"list of distinct core ids"):
        build_config(None, None, ["placement.pools.gen.cores=[1,1]"])


def test_the_local_runtime_warns_that_each_pools_cores_are_ignored(capsys):
    cfg = build_config(None, None, ["placement.pools.gen.cores=[0]",
                                    "placement.pools.main.cores=[0]"])
    said = check_applicable(cfg)
    assert [s.split(" has no effect")[0] for s in said] == [
        "placement.pools.main.cores=[0]", "placement.pools.gen.cores=[0]"]
    assert "and here runtime.name='local'; it is ignored" in said[1]
    ray = build_config(None, None, ["placement.pools.gen.cores=[0]", "runtime.name=ray"])
    assert check_applicable(ray) == []


def _threads_cores(pid: int) -> set[str]:
    """Cpus_allowed_list of every thread of a process (this machine's /proc)."""
    out = set()
    for tid in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{tid}/status") as status:
            out |= {line.split(":")[1].strip() for line in status
                    if line.startswith("Cpus_allowed_list")}
    return out


@pytest.mark.ray
@pytest.mark.slow  # a Ray session, two small worker groups
def test_a_pinned_pool_runs_each_worker_on_its_slice(ray_session):
    from hybridflow.plan.compiler import compile_graph
    from hybridflow.runtime.ray.executor import RayRuntime
    from tests.support import runtime_fakes as fakes

    cores = CORES[-2:] if len(CORES) >= 2 else CORES * 2  # two workers, a core each
    if len(set(cores)) < 2:
        pytest.skip("needs two cores")
    placement = Placement.from_config({"pools": {"p": {"devices_per_node": 2,
                                                       "cores": cores}},
                                       "roles": {"echo": "p"}})
    plan = compile_graph(fakes.call_graph("echo.allreduce"), fakes.ECHO_BINDINGS, placement)
    rt = RayRuntime(plan, {"runtime": {"call_timeout_s": 60}})
    try:
        pids = [info["pid"] for info in rt.worker_info("p")]
        assert [_threads_cores(pid) for pid in pids] == [{str(cores[0])}, {str(cores[1])}]
        result = rt.run_step({"prompts": fakes.prompts(4)})  # still works, pinned
        y = rt.fetch(result, "echo.allreduce", ["y"])["y"]
        assert y.tolist() == [1 + 2] * 4  # each rank's rank + 1, summed
    finally:
        rt.shutdown()

    bad = Placement.from_config({"pools": {"p": {"cores": [4096]}}, "roles": {"echo": "p"}})
    plan = compile_graph(fakes.call_graph("echo.allreduce"), fakes.ECHO_BINDINGS, bad)
    with pytest.raises(RuntimeError) as err:
        RayRuntime(plan, {"runtime": {"call_timeout_s": 60}})
    assert str(err.value).startswith(
        "pool 'p': pinning to cores failed on rank 0: ValueError: placement.pools.p.cores=[4096]: "
        "core(s) [4096] are not among the cores this worker may use on its node")
