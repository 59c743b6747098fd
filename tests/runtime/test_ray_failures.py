"""Ray runtime failures: a worker exception, a hung worker, a worker process that
exits and a killed actor each end the step with a NodeFailure naming node, role and
rank, within `runtime.call_timeout_s`, never a hang."""
from __future__ import annotations

import time

import pytest
import ray

from tests.support import runtime_fakes as fakes
from hybridflow.runtime.common import NodeFailure
from hybridflow.runtime.ray.executor import RayRuntime

pytestmark = [pytest.mark.ray, pytest.mark.slow]  # hung, killed and exiting Ray workers (~39 s)
TIMEOUT = 4.0
CFG = {"runtime": {"call_timeout_s": TIMEOUT}}


def plan(method: str):
    return fakes.echo_plan(fakes.call_graph(f"echo.{method}", name=method), devices=2, tp=1)


def feeds(rows: int = 4):
    return {"prompts": fakes.prompts(rows)}


@pytest.fixture(scope="module")
def shared(ray_session):
    """For failures that leave the workers usable."""
    rt = RayRuntime(plan("dp"), CFG)
    yield rt
    rt.shutdown()


@pytest.fixture
def runtime(ray_session):
    """For failures that break the workers (a hang, a dead process)."""
    rt = RayRuntime(plan("dp"), CFG)
    yield rt
    rt.shutdown()


def failure(rt, method: str) -> tuple[NodeFailure, float]:
    start = time.time()
    with pytest.raises(NodeFailure) as err:
        rt.run_step(feeds(), plan=plan(method))
    return err.value, time.time() - start


def test_worker_exception_names_node_role_rank_and_traceback(shared):
    runtime = shared
    err, _ = failure(runtime, "fail_on_rank1")
    assert (err.node, err.rank) == ("echo.fail_on_rank1", 1)
    text = str(err)
    assert "role 'echo' rank 1" in text and "runtime_fakes.py" in text.splitlines()[0]
    assert "ZeroDivisionError: fake failure in the worker" in text
    assert "in fail_on_rank1" in text  # the worker's own traceback
    assert "call_timeout_s" not in text  # reported by the worker, not by the deadline
    # an exception does not break the workers: the next step runs
    result = runtime.run_step(feeds(), plan=plan("dp"))
    assert runtime.fetch(result, "echo.dp", ["y"])["y"].shape[0] == 4


def test_a_failing_function_node_names_the_worker_it_ran_on(shared):
    """A whole-batch function runs on the worker holding its first input: the
    failure names that worker (it used to say "the driver")."""
    runtime = shared
    g = fakes.Graph("bad_fn")
    p = g.source("prompts", keys=("input_ids", "uid"))
    score = g.call("echo.dp", p)

    @fakes.node_fn(reads=("y",), writes=("s",))
    def broken(batch):
        raise KeyError("no such column")
    g.fn(broken, score)
    with pytest.raises(NodeFailure, match="failed on the worker of pool 'wide' rank 0") as err:
        runtime.run_step(feeds(), plan=fakes.echo_plan(g, devices=2, tp=1))
    assert (err.value.node, err.value.rank) == ("broken", 0) and "KeyError" in str(err.value)


def test_a_hung_worker_fails_after_the_call_timeout(runtime):
    err, took = failure(runtime, "hang")
    assert (err.node, err.rank) == ("echo.hang", 0)
    assert "call_timeout_s=4s" in str(err)
    assert took >= TIMEOUT  # the deadline, not an earlier error, stopped it
    with pytest.raises(RuntimeError, match="cannot run another step"):
        runtime.run_step(feeds(), plan=plan("dp"))


def test_a_worker_process_that_exits_fails_fast(runtime):
    err, _ = failure(runtime, "die_on_rank1")
    assert (err.node, err.rank) == ("echo.die_on_rank1", 1)
    assert "worker process of pool 'wide' rank 1 died" in str(err)
    assert "call_timeout_s" not in str(err)  # seen as a death, not waited out


def killed(actor) -> None:
    """`ray.kill` returns before the process is gone: under load a step sent at once
    could still run on it. Wait until the actor answers as dead."""
    ray.kill(actor, no_restart=True)
    deadline = time.time() + 30
    while time.time() < deadline:
        try:
            ray.get(actor.__ray_ready__.remote(), timeout=5)
        except ray.exceptions.RayActorError:
            return
        except ray.exceptions.GetTimeoutError:
            continue
        time.sleep(0.05)
    raise AssertionError("the killed actor still answers after 30 s")


def test_a_killed_actor_fails_the_next_step_fast(runtime):
    killed(runtime.actors("wide")[1])
    err, _ = failure(runtime, "dp")
    assert (err.node, err.rank) == ("echo.dp", 1)
    assert "died" in str(err) and "call_timeout_s" not in str(err)
