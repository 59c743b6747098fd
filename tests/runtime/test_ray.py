"""Ray runtime (hybridflow/runtime/ray/executor.py): same outputs as the local runtime for every
dispatch mode and for a PPO-shaped graph, resharding between layouts, overlap of
disjoint pools, colocation in one process, the torch.distributed env, and the bytes
that cross the driver. One Ray session for the module (4 logical GPUs on the CPU)."""
from __future__ import annotations

import pytest
import torch

from tests.support import runtime_fakes as fakes
from hybridflow.core.batch import Batch
from hybridflow.runtime.local import LocalRuntime
from hybridflow.runtime.ray.executor import RayRuntime

# a Ray session and every dispatch mode on it (~25 s)
pytestmark = [pytest.mark.ray, pytest.mark.slow]
CFG = {"runtime": {"call_timeout_s": 60}}


@pytest.fixture(scope="module")
def echo(ray_session):
    """One pool of 4 ranks holding the Echo role (tensor-parallel size 2 for dp_tp)."""
    runtime = RayRuntime(fakes.echo_plan(fakes.call_graph("echo.dp")), CFG)
    yield runtime
    runtime.shutdown()


@pytest.fixture(scope="module")
def ppo(echo):
    """actor+ref on a pool of 3 ranks, critic+reward on a pool of 1 rank."""
    echo.shutdown()  # four logical GPUs: the echo pool gives its devices back
    runtime = RayRuntime(fakes.ppo_plan(), CFG)
    yield runtime
    runtime.shutdown()


def assert_same(ray_batch: Batch, local_batch: Batch, where: str = "") -> None:
    assert sorted(ray_batch.keys()) == sorted(local_batch.keys()), where
    for key in local_batch.tensors:
        assert torch.equal(ray_batch[key], local_batch[key]), f"{where}: {key}"
    for key in local_batch.non_tensors:
        assert list(ray_batch[key]) == list(local_batch[key]), f"{where}: {key}"


def run_both(runtime: RayRuntime, plan, feeds):
    local = LocalRuntime(plan, {})
    return runtime.run_step(feeds, plan=plan), local.run_step(feeds)


# ----------------------------------------------------------------- dispatch modes
@pytest.mark.parametrize("mode", ["dp", "dp_tp", "rank_zero", "broadcast", fakes.REVERSED])
def test_every_dispatch_mode_gives_the_local_output_for_batch_sizes_1_to_2n(echo, mode):
    plan = fakes.echo_plan(fakes.call_graph(f"echo.{mode}", name=mode))
    for rows in range(1, 9):
        result, expected = run_both(echo, plan, {"prompts": fakes.prompts(rows)})
        node = f"echo.{mode}"
        assert_same(echo.fetch(result, node, ["y", "rank"]), expected.outputs[node],
                    f"{mode} rows={rows}")
        assert result.node_metrics[node] == expected.node_metrics[node]


def test_reshard_between_layouts_round_trips_every_row(echo):
    """reversed over 4 -> dp_tp (2 groups) -> rank_zero (1) -> dp over the 2 tp groups,
    sizes 1..8."""
    plan = fakes.echo_plan(fakes.relay_graph())
    for rows in range(1, 9):
        result, expected = run_both(echo, plan, {"prompts": fakes.prompts(rows)})
        for node in (f"echo.{fakes.REVERSED}", "echo.relay_tp", "echo.relay_zero", "echo.relay_dp"):
            want = expected.outputs[node]
            assert_same(echo.fetch(result, node, want.keys()), want, f"{node} rows={rows}")
        assert result.outputs["echo.relay_dp"].rows == \
            [len(c) for c in fakes.prompts(rows).split(2)]


def user_mode_graph(mode: str):
    """dp over 4 ranks, then a node of `mode` reading dp's output (born on the workers)."""
    g = fakes.Graph(f"after_dp_{mode}")
    p = g.source("prompts", keys=("input_ids", "uid"))
    g.call(f"echo.{mode}", g.call("echo.dp", p), name="user")
    return g


def test_a_user_slot_layout_moves_no_bytes_through_the_driver_or_rank_zero(echo):
    """The reversed mode's chunk c goes from dp's rank c straight to rank 3-c: one task
    per rank, no scatter/collect on rank 0, and the driver sees only the feed."""
    feeds = {"prompts": fakes.prompts(4096)}  # 128 KiB: put in the object store once
    only_dp = echo.run_step(feeds, plan=fakes.echo_plan(fakes.call_graph("echo.dp")))
    plan = fakes.echo_plan(user_mode_graph("relay_reversed"))
    result = echo.run_step(feeds, plan=plan)
    assert result.driver_bytes == only_dp.driver_bytes > 0
    tasks = sorted(e["rank"] for e in result.timeline if e["node"] == "user")
    assert tasks == [0, 1, 2, 3]
    out = echo.fetch(result, "user", ["z", "rank_z"])
    assert torch.equal(out["z"], fakes.prompts(4096)["input_ids"] * 2 + 1)
    assert out["rank_z"].tolist() == [3 - c for c in range(4) for _ in range(1024)]
    assert [home[1] for home in result.outputs["user"].homes] == [3, 2, 1, 0]


def test_ranks_share_one_torch_distributed_world(echo):
    plan = fakes.echo_plan(fakes.call_graph("echo.allreduce", name="allreduce"))
    result = echo.run_step({"prompts": fakes.prompts(8)}, plan=plan)
    assert echo.fetch(result, "echo.allreduce", ["y"])["y"].tolist() == [10] * 8  # 1+2+3+4


# -------------------------------------------------------------------- PPO shape
def test_ppo_graph_matches_the_local_runtime(ppo):
    feeds = {"prompts": fakes.prompts(6)}
    result = ppo.run_step(feeds)
    expected = LocalRuntime(fakes.local_ppo_plan(), {}).run_step(feeds)
    for node, want in expected.outputs.items():
        assert_same(ppo.fetch(result, node, want.keys()), want, node)
        assert result.node_metrics[node] == pytest.approx(expected.node_metrics[node]), node
    ran_on = {(e["node"], e["pool"]) for e in result.timeline}
    assert ("group_advantages", "train") in ran_on      # group_by: sharded on the workers
    total_pools = {pool for name, pool in ran_on if name == "total_score"}
    assert total_pools and None not in total_pools       # whole-batch fn: on a worker too


def test_ppo_graph_passes_under_one_percent_of_the_bytes_through_the_driver(ppo):
    plan = fakes.ppo_plan(fakes.ppo_graph(n=2, length=4096))
    result = ppo.run_step({"prompts": fakes.prompts(64)}, plan=plan)
    total = ppo.output_bytes(result)
    assert total > 4_000_000
    assert result.driver_bytes < 0.01 * total, (result.driver_bytes, total)


def test_gather_re_draws_sources_like_the_local_runtime(ppo):
    plan = fakes.gather_plan(until=10, max_rounds=3)
    for rows, max_rounds in ((4, 3), (4, 0), (12, 3)):
        plan.node("gather").kwargs["max_rounds"] = max_rounds
        feeds = {"prompts": fakes.prompts(rows)}
        result = ppo.run_step(feeds, plan=plan, draw=fakes.Drawer(rows, first=rows))
        expected = LocalRuntime(plan, {}).run_step(feeds, draw=fakes.Drawer(rows, first=rows))
        want = expected.outputs["gather"]
        assert_same(ppo.fetch(result, "gather", want.keys()), want, f"rows={rows}")
        for node in ("gather", "kept", "actor.generate"):
            assert result.node_metrics[node] == pytest.approx(expected.node_metrics[node])


def test_independent_nodes_on_disjoint_pools_overlap(ppo):
    g = fakes.Graph("overlap")
    p = g.source("prompts", keys=("input_ids", "uid"))
    rollout = g.call("actor.generate", p)
    g.call("ref.logprob", rollout, sleep=0.5)
    g.call("reward.score", rollout, sleep=0.5)
    result = ppo.run_step({"prompts": fakes.prompts(3)}, plan=fakes.ppo_plan(g))

    def span(node):
        entries = [e for e in result.timeline if e["node"] == node]
        return min(e["start"] for e in entries), max(e["end"] for e in entries)
    (ref_start, ref_end), (rew_start, rew_end) = span("ref.logprob"), span("reward.score")
    assert ref_start < rew_end and rew_start < ref_end  # the intervals intersect


def test_colocated_roles_share_one_process_per_rank(ppo):
    actor, ref = ppo.call_role("actor", "getpid"), ppo.call_role("ref", "getpid")
    critic, reward = ppo.call_role("critic", "getpid"), ppo.call_role("reward", "getpid")
    assert actor == ref and len(set(actor)) == 3
    assert critic == reward and not set(critic) & set(actor)


def test_ranks_get_the_torch_distributed_env(ppo):
    envs = ppo.call_role("actor", "rank_env")
    assert [e["RANK"] for e in envs] == ["0", "1", "2"]
    assert [e["LOCAL_RANK"] for e in envs] == ["0", "1", "2"]
    assert {e["WORLD_SIZE"] for e in envs} == {"3"}
    assert len({(e["MASTER_ADDR"], e["MASTER_PORT"]) for e in envs}) == 1
    assert int(envs[0]["MASTER_PORT"]) > 0


def test_a_plan_with_a_role_that_is_not_running_is_refused(ppo):
    plan = fakes.echo_plan(fakes.call_graph("echo.dp"))
    with pytest.raises(ValueError, match="role 'echo' on pool 'wide' is not running"):
        ppo.run_step({"prompts": fakes.prompts(2)}, plan=plan)
