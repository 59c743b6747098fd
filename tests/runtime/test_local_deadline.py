"""The local runtime bounds every call into user code by runtime.call_timeout_s: a
worker method or a function node that never returns stops the step with a
NodeFailure naming the node and the bound, instead of hanging the run."""
from __future__ import annotations


import pytest
from tests.support import runtime_fakes as fakes

from hybridflow import Batch, Graph, node_fn
from hybridflow.runtime.common import NodeFailure
from hybridflow.runtime.local import LocalRuntime

CFG = {"runtime": {"call_timeout_s": 0.5}}


@pytest.mark.timeout(60)  # the method sleeps 60 s: only the 0.5 s bound ends it sooner
def test_a_worker_method_that_hangs_is_stopped_naming_node_and_bound():
    plan = fakes.echo_plan(fakes.call_graph("echo.hang", seconds=60.0), 1, 1)
    with pytest.raises(NodeFailure) as info:
        LocalRuntime(plan, CFG).run_step({"prompts": fakes.prompts(2)})
    assert "node 'echo.hang'" in info.value.headline
    assert "runtime.call_timeout_s=0.5s" in info.value.summary


@node_fn(reads=("input_ids",), writes=("z",))
def spins_forever(batch: Batch) -> Batch:
    while True:
        pass


def test_a_function_node_that_never_returns_is_stopped():
    g = Graph("spin")
    prompts = g.source("prompts", keys=("input_ids", "uid"))
    g.fn(spins_forever, prompts)
    plan = fakes.echo_plan(g, 1, 1)
    with pytest.raises(NodeFailure) as info:
        LocalRuntime(plan, CFG).run_step({"prompts": fakes.prompts(2)})
    assert "node 'spins_forever'" in info.value.headline
    assert "did not return within runtime.call_timeout_s=0.5s" in info.value.summary
