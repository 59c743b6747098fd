"""The weight-sync edge (hybridflow/plan/weight_sync.py): present, drawn and ordered after
the actor's update only when the rollout holds its own weights on another pool."""
import os

import pytest

from hybridflow.program.assemble import load_plan
from hybridflow.graph.dispatch import BROADCAST
from hybridflow.draw.graph import edge_keys, plan_to_dot
from hybridflow.plan.weight_sync import planner_view, resync_plan

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GRAPHS = os.path.join(REPO, "graphs")
SPLIT = ["placement.pools.gen.devices_per_node=2", "placement.roles.rollout=gen"]


def plan_of(name="grpo", *overrides):
    return load_plan(os.path.join(GRAPHS, f"{name}.py"), list(overrides))


def test_a_colocated_rollout_needs_no_sync():
    plan = plan_of()
    assert plan.placement.folded["rollout"] == "actor"
    assert not any(n.method in ("export_weights", "load_weights") for n in plan.nodes)
    assert "weight_sync" not in plan_to_dot(plan, show_plan=True).source
    assert resync_plan(plan) is None


@pytest.mark.parametrize("graph", ["grpo", "ppo", "remax", "dapo"])
def test_a_split_rollout_gets_export_then_load_after_the_actor_update(graph):
    plan = plan_of(graph, *SPLIT)
    export, load = plan.node("weight_export"), plan.node("weight_sync")
    assert (export.role, export.method, export.pool, export.dispatch) == \
        ("actor", "export_weights", "main", BROADCAST)  # every rank gathers
    assert (load.role, load.method, load.pool, load.dispatch) == \
        ("rollout", "load_weights", "gen", BROADCAST)
    assert export.deps == ("actor.update",) and load.deps == ("weight_export",)
    names = [n.name for n in plan.nodes]
    assert names.index("actor.update") < names.index("weight_export") < names.index("weight_sync")
    assert plan.stages[-2:] == [["weight_export"], ["weight_sync"]]
    assert edge_keys(plan, "weight_export", "weight_sync")[0] == ["weights", "weight_index"]
    assert "weight_sync.py" in load.location
    assert "rollout" not in plan.placement.folded


def test_the_sync_is_drawn_and_listed():
    plan = plan_of("grpo", *SPLIT)
    dot = plan_to_dot(plan, show_plan=True).source
    assert "weight_export" in dot and "weight_sync" in dot and "weight_index" in dot
    assert "weight_sync" in plan.summary() and "rollout@gen" in plan.summary()


def test_the_resume_sync_is_the_two_nodes_without_the_update():
    sync = resync_plan(plan_of("grpo", *SPLIT))
    assert [n.name for n in sync.nodes] == ["weight_export", "weight_sync"]
    assert sync.node("weight_export").deps == ()


def test_the_planner_sees_a_folded_rollout_as_the_actor():
    view = planner_view(plan_of())
    assert "rollout" not in {n.role for n in view.nodes}
    assert view.node("rollout.generate").role == "actor"
    split = planner_view(plan_of("grpo", *SPLIT))
    assert split.node("rollout.generate").role == "rollout"  # its own model: planned apart


def test_a_host_without_export_is_refused_before_launch(tmp_path):
    worker = tmp_path / "plain_actor.py"
    worker.write_text("from hybridflow.workers.actor import ActorWorker\n"
                      "class PlainActor(ActorWorker):\n"
                      "    export_weights = None\n")
    with pytest.raises(ValueError, match=r"'rollout' is placed on pool 'gen'.*no @method "
                                         r"export_weights"):
        plan_of("grpo", *SPLIT, f"workers.actor={worker}:PlainActor")
