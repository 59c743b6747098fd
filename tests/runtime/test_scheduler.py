"""The step scheduler (hybridflow/runtime/scheduler.py) behind both executors: every
test runs on the local runtime and on the Ray runtime (one Ray session for the
module, 4 logical GPUs on the CPU) and asserts the same behaviour: a chain across
layouts, independent nodes, gather rounds, uneven batch sizes, colocated and split
pools, user-registered dispatch modes, failures naming node, role and rank, and
metrics and timeline of identical keys."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.support import runtime_fakes as fakes
from hybridflow.plan.placement import Placement
from hybridflow.runtime.common import NodeFailure
from hybridflow.runtime.local import LocalRuntime

CFG = {"runtime": {"call_timeout_s": 60}}
TIMELINE_KEYS = {"node", "role", "pool", "rank", "start", "end"}


class Executor:
    """One runtime at a time of one kind; a plan on other pools or roles replaces it
    (four logical GPUs hold one Ray runtime of these sizes at a time)."""

    def __init__(self, kind: str):
        self.kind, self.runtime, self.key = kind, None, None

    def run(self, plan, rows_or_feeds, **kwargs):
        feeds = rows_or_feeds if isinstance(rows_or_feeds, dict) else \
            {"prompts": fakes.prompts(rows_or_feeds)}
        return self.runtime_for(plan).run_step(feeds, plan=plan, **kwargs)

    def fetch(self, result, node: str, keys=None):
        keys = keys if keys is not None else (
            result.outputs[node].keys() if self.kind == "local" else result.outputs[node].keys)
        return self.runtime.fetch(result, node, keys)

    def runtime_for(self, plan):
        placement = plan.placement
        key = (sorted((p, s.world_size) for p, s in placement.pools.items()),
               sorted(placement.roles.items()), sorted(plan.bindings))
        if key != self.key:
            self.close()
            cls = LocalRuntime if self.kind == "local" else _ray_runtime()
            self.runtime, self.key = cls(plan, CFG), key
        return self.runtime

    def close(self):
        if self.runtime is not None:
            self.runtime.shutdown()
        self.runtime, self.key = None, None


def _ray_runtime():
    from hybridflow.runtime.ray.executor import RayRuntime
    return RayRuntime


@pytest.fixture(scope="module", params=["local", pytest.param("ray", marks=[pytest.mark.ray,
                                                                   pytest.mark.slow])])
def executor(request):
    if request.param == "ray":
        request.getfixturevalue("ray_session")
    ex = Executor(request.param)
    yield ex
    ex.close()


def echo_rows(rows: int, world: int = 4) -> list[list[int]]:
    """Row indices per DP chunk, as Batch.split cuts them."""
    return [list(range(a, a + len(c))) for a, c in
            zip(np.cumsum([0] + [len(c) for c in fakes.prompts(rows).split(world)]),
                fakes.prompts(rows).split(world))]


def rank_of_rows(rows: int, world: int, rank_of_chunk) -> list[int]:
    return [rank_of_chunk(c) for c, chunk in enumerate(echo_rows(rows, world)) for _ in chunk]


# ------------------------------------------------------------------ echo pool (4 ranks)
def test_a_chain_across_layouts_keeps_every_row_for_uneven_sizes(executor):
    """reversed (4 slots) -> dp_tp (2) -> rank_zero (1) -> dp (2 tp groups), 1..9 rows
    over 4 ranks."""
    plan = fakes.echo_plan(fakes.relay_graph())
    for rows in range(1, 10):
        result = executor.run(plan, rows)
        out = executor.fetch(result, "echo.relay_dp")
        assert torch.equal(out["v"], fakes.prompts(rows)["input_ids"] * 2 + 3), rows
        assert out["rank_v"].tolist() == rank_of_rows(rows, 2, lambda c: 2 * c), rows
        assert result.rows["echo.relay_dp"] == rows and result.rows["prompts"] == rows


@pytest.mark.parametrize("mode, rank_of_chunk, world", [
    (fakes.REVERSED, lambda c: 3 - c, 4),   # slot layout: chunk c on rank 3 - c
    (fakes.ODD_RANKS, lambda c: 2 * c + 1, 2)])  # rows over ranks 1 and 3 only
def test_a_user_registered_mode_puts_rows_where_it_says(executor, mode, rank_of_chunk, world):
    plan = fakes.echo_plan(fakes.call_graph(f"echo.{mode}", name=mode))
    for rows in (1, 3, 6, 9):
        result = executor.run(plan, rows)
        out = executor.fetch(result, f"echo.{mode}", ["y", "rank"])
        assert torch.equal(out["y"], fakes.prompts(rows)["input_ids"] * 2), (mode, rows)
        assert out["rank"].tolist() == rank_of_rows(rows, world, rank_of_chunk), (mode, rows)
        sizes = [len(c) for c in echo_rows(rows, world)]  # each rank reports its rows
        mean = sum(n * n for n in sizes) / rows           # weighted by rows
        assert result.node_metrics[f"echo.{mode}"] == {"echo/rows": pytest.approx(mean)}


def test_a_failing_worker_method_names_node_role_and_rank(executor):
    plan = fakes.echo_plan(fakes.call_graph("echo.fail_on_rank1", name="fail"))
    with pytest.raises(NodeFailure) as err:
        executor.run(plan, 4)
    assert (err.value.node, err.value.rank) == ("echo.fail_on_rank1", 1)
    assert "role 'echo' rank 1" in str(err.value)
    assert "ZeroDivisionError: fake failure in the worker" in str(err.value)
    executor.run(fakes.echo_plan(fakes.call_graph("echo.dp")), 4)  # the workers still run


@pytest.mark.parametrize("fn, where, rank", [
    # whole-batch: on its input's first worker
    (fakes.broken_sum, "the worker of pool 'wide' rank 0", 0),
    (fakes.StatefulBroken(), "the driver", None)])
def test_a_failing_function_node_names_where_it_ran(executor, fn, where, rank):
    g = fakes.Graph("bad_fn")
    p = g.source("prompts", keys=("input_ids", "uid"))
    g.fn(fn, g.call("echo.dp", p), name="bad")
    with pytest.raises(NodeFailure, match=f"failed on {where}") as err:
        executor.run(fakes.echo_plan(g), 4)
    assert (err.value.node, err.value.rank) == ("bad", rank)
    assert "KeyError: 'no such column'" in str(err.value)


# ------------------------------------------------------------------ PPO shape
COLOCATED = Placement.single_pool(fakes.PPO_BINDINGS, devices=1)
SPLIT = fakes.ppo_placement(train=1, aux=1)


@pytest.mark.parametrize("placement", [COLOCATED, SPLIT], ids=["colocated", "split"])
def test_ppo_graph_on_colocated_and_split_pools(executor, placement):
    plan = fakes.compile_graph(fakes.ppo_graph(), fakes.PPO_BINDINGS, placement)
    result = executor.run(plan, 6)
    adv = executor.fetch(result, "group_advantages", ["advantages"])["advantages"]
    assert torch.allclose(adv.view(6, 2).sum(-1), torch.zeros(6))  # zero mean per group
    assert {"actor/loss", "critic/loss", "adv/mean_abs"} <= set(result.metrics)
    pools = {e["node"]: e["pool"] for e in result.timeline}
    assert pools["reward.score"] == placement.roles["reward"]
    assert pools["group_advantages"] == placement.roles["actor"]  # sharded: on the workers
    assert shares_process(executor, "actor", "ref")
    assert shares_process(executor, "actor", "critic") == (placement is COLOCATED)


def shares_process(executor, a: str, b: str) -> bool:
    """Colocated roles: one process per rank on Ray, one dict of objects locally."""
    rt = executor.runtime
    if executor.kind == "local":
        return rt.workers(a)[0].ctx.colocated is rt.workers(b)[0].ctx.colocated
    return rt.call_role(a, "getpid") == rt.call_role(b, "getpid")


def test_independent_nodes_both_run_once_on_their_pools(executor):
    g = fakes.Graph("independent")
    p = g.source("prompts", keys=("input_ids", "uid"))
    rollout = g.call("actor.generate", p)
    g.call("ref.logprob", rollout)
    g.call("reward.score", rollout)
    result = executor.run(fakes.compile_graph(g, fakes.PPO_BINDINGS, SPLIT), 3)
    ran = [(e["node"], e["pool"]) for e in result.timeline]
    assert ran.count(("ref.logprob", "train")) == 1 and ran.count(("reward.score", "aux")) == 1
    assert executor.fetch(result, "reward.score")["scores"].shape == (6,)


@pytest.mark.parametrize("rows, max_rounds, kept, extra", [
    (4, 3, 10, 2),    # 4 even-uid rows a round: two more rounds reach 10
    (4, 0, 4, 0),     # no extra round allowed: short
    (12, 3, 10, 0)])  # enough at once: the first 10
def test_gather_rounds_draw_until_enough_rows(executor, rows, max_rounds, kept, extra):
    """DAPO's dynamic sampling: a filter keeps even uids; the gather re-draws prompts."""
    plan = fakes.gather_plan(until=10, max_rounds=max_rounds, placement=SPLIT)
    result = executor.run(plan, rows, draw=fakes.Drawer(rows, first=rows))
    out = executor.fetch(result, "gather", ["uid", "responses"])
    assert len(out) == kept and all(int(u[1:]) % 2 == 0 for u in out["uid"])
    assert out["uid"].tolist()[:2] == ["u0", "u0"]  # the first round's rows come first
    assert result.node_metrics["gather"]["gather/extra_rounds"] == extra
    draws = [e for e in result.timeline if e["node"] == "actor.generate"]
    assert len(draws) == 1 + extra  # one task (one rank) per round


# ------------------------------------------------------------------ both at once
def test_metrics_and_timeline_have_the_same_keys_on_both_executors(executor):
    if executor.kind == "local":
        pytest.skip("compares the Ray executor with a local runtime")
    plan = fakes.compile_graph(fakes.ppo_graph(), fakes.PPO_BINDINGS, SPLIT)
    feeds = {"prompts": fakes.prompts(6)}
    local = LocalRuntime(plan, CFG).run_step(feeds)
    remote = executor.run(plan, feeds)
    assert set(local.metrics) == set(remote.metrics)
    assert {"runtime/driver_busy_s", "runtime/pass_s", "timing_s/actor.update"} <= \
        set(local.metrics)
    for node, metrics in local.node_metrics.items():
        assert remote.node_metrics[node] == pytest.approx(metrics), node
    assert local.rows == remote.rows
    assert all(set(e) == TIMELINE_KEYS for e in local.timeline + remote.timeline)
    assert sorted((e["node"], e["pool"], e["rank"]) for e in local.timeline) == \
        sorted((e["node"], e["pool"], e["rank"]) for e in remote.timeline)
    assert local.driver_bytes == 0  # nothing crosses a process locally
