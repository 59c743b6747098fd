"""Local runtime (hybridflow/runtime/local.py), the inline executor of the step
scheduler: dispatch modes over simulated ranks, batch sizes 1..2N round-tripping,
a PPO-shaped graph, colocation and failures naming node, role and rank. What both
executors must agree on is in test_scheduler.py."""
from __future__ import annotations

import os

import pytest
import torch

from tests.support import runtime_fakes as fakes
from hybridflow.plan.compiler import GraphError, compile_graph
from hybridflow.runtime.common import NodeFailure
from hybridflow.runtime.local import LocalRuntime


def run(method: str, rows: int, devices: int = 4, tp: int = 2):
    plan = fakes.echo_plan(fakes.call_graph(f"echo.{method}"), devices, tp)
    return LocalRuntime(plan, {}).run_step({"prompts": fakes.prompts(rows)})


def expected_ranks(rows: int, world: int, mode: str) -> list[int]:
    """The rank that computed each row: chunk c of the split goes to rank c (dp), to
    the first rank of tp group c (dp_tp, and dp on this tp=2 role: a data-parallel
    call splits over tp groups), to rank world-1-c (reversed)."""
    if mode in ("rank_zero", "broadcast"):
        return [0] * rows
    slots = world // 2 if mode in ("dp", "dp_tp") else world
    chunk = [c for c, part in enumerate(fakes.prompts(rows).split(slots)) for _ in range(len(part))]
    return [{"dp": 2 * c, "dp_tp": 2 * c, fakes.REVERSED: world - 1 - c}[mode] for c in chunk]


@pytest.mark.parametrize("mode", ["dp", "dp_tp", "rank_zero", "broadcast", fakes.REVERSED])
def test_each_dispatch_mode_round_trips_batch_sizes_1_to_2n(mode):
    for rows in range(1, 9):
        out = run(mode, rows).outputs[f"echo.{mode}"]
        assert torch.equal(out["y"], fakes.prompts(rows)["input_ids"] * 2), (mode, rows)
        assert out["rank"].tolist() == expected_ranks(rows, 4, mode), (mode, rows)


def test_one_per_worker_is_refused_as_a_graph_node_before_anything_runs():
    with pytest.raises(GraphError, match="one value per rank.*call_role"):
        run("one_per_worker", 4)


def test_relay_across_layouts_keeps_every_row():
    plan = fakes.echo_plan(fakes.relay_graph())
    for rows in range(1, 9):
        out = LocalRuntime(plan, {}).run_step({"prompts": fakes.prompts(rows)}).outputs
        assert torch.equal(out["echo.relay_dp"]["v"], fakes.prompts(rows)["input_ids"] * 2 + 3)


def test_ppo_graph_runs_with_group_advantages_and_records_timing():
    result = LocalRuntime(fakes.local_ppo_plan(), {}).run_step({"prompts": fakes.prompts(6)})
    adv = result.outputs["group_advantages"]["advantages"]
    assert torch.allclose(adv.view(6, 2).sum(-1), torch.zeros(6))  # zero mean per group
    assert {"actor/loss", "critic/loss", "timing_s/actor.update"} <= set(result.metrics)
    assert [e["node"] for e in result.timeline][:2] == ["prompts", "actor.generate"]


def test_colocated_roles_are_objects_of_one_process():
    rt = LocalRuntime(fakes.local_ppo_plan(), {})
    actor, ref = rt.workers("actor")[0], rt.workers("ref")[0]
    assert actor.ctx.colocated["ref"] is ref and actor.ctx.colocated is ref.ctx.colocated
    assert rt.call_role("actor", "getpid") == rt.call_role("ref", "getpid") == [os.getpid()]


def test_trained_roles_on_several_local_ranks_are_refused():
    with pytest.raises(ValueError, match="use --runtime ray"):
        LocalRuntime(fakes.ppo_plan(), {})


def test_worker_exception_names_node_role_and_rank():
    plan = fakes.echo_plan(fakes.call_graph("echo.fail_on_rank1"), devices=2, tp=1)
    with pytest.raises(NodeFailure) as err:
        LocalRuntime(plan, {}).run_step({"prompts": fakes.prompts(4)})
    assert (err.value.node, err.value.rank) == ("echo.fail_on_rank1", 1)
    assert "role 'echo' rank 1" in str(err.value) and "ZeroDivisionError" in str(err.value)


def test_broadcast_node_output_is_the_first_ranks_batch():
    out = run("broadcast", 3).outputs["echo.broadcast"]
    assert len(out) == 3 and out.meta["_writers"] == {"y": "echo.broadcast",
                                                      "rank": "echo.broadcast"}


def test_plan_compiles_with_single_pool_placement():
    plan = compile_graph(fakes.ppo_graph(), fakes.PPO_BINDINGS,
                         fakes.Placement.single_pool(fakes.PPO_BINDINGS))
    assert plan.placement.colocated() == {"main": ["actor", "ref", "critic", "reward"]}
