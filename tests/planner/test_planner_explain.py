"""The result explains itself: table, paragraph, JSON, placement config and drawing."""
import json
import shutil

import pytest
from planner_graphs import PAPER_WORKLOAD, Node, TinyGraph, a100, grpo_graph, ppo_graph, same_size

from hybridflow.plan.placement import Placement
from hybridflow.planner import Cluster, PlanningError, plan_placement
from hybridflow.planner.render import RenderError, plan_to_dot


@pytest.fixture(scope="module")
def split_result():
    return plan_placement(ppo_graph(), a100(128),
                          same_size("34b", ("actor", "ref", "critic", "reward")),
                          PAPER_WORKLOAD, top_k=3)


def test_explain_has_a_ranked_table_a_paragraph_and_node_times(split_result):
    text = split_result.explain()
    assert "pools [devices: role dp x tp]" in text and "best" in text
    assert "Best plan: split the roles into" in text
    assert "Colocating everything would take" in text  # the fixed plan it beat, with the numbers
    assert "actor.generate" in text and "critical path" in text
    assert "search simulated" in text


def test_json_is_serialisable_and_complete(split_result):
    data = json.loads(json.dumps(split_result.to_json()))
    assert data["best"]["step_seconds"] == pytest.approx(split_result.best.step_seconds, abs=1e-3)
    assert len(data["candidates"]) == 2 and all(c["reason"] for c in data["candidates"])
    assert set(data["best"]["nodes"]) == {n.name for n in ppo_graph().nodes}
    memory = data["best"]["pools"][0]["memory"]
    assert memory["total_gib"] <= memory["usable_gib"]
    assert data["colocated"]["label"].startswith("actor+ref+critic+reward[128")


def test_placement_config_is_accepted_by_the_runtime_schema(split_result):
    config = split_result.best.to_placement_config()
    assert set(config) == {"pools", "roles", "parallel"}
    placement = Placement.from_config(config)
    assert set(placement.roles) == {"actor", "ref", "critic", "reward"}
    for role, pool_name in config["roles"].items():
        pool = config["pools"][pool_name]
        layout = config["parallel"][role]
        assert layout["dp"] * layout["tp"] == pool["nodes"] * pool["devices_per_node"]


def test_rule_roles_run_on_the_driver_and_are_left_out_of_the_config():
    result = plan_placement(grpo_graph(), Cluster(1, 8, "h100"), same_size("7b", ("actor", "ref")),
                            PAPER_WORKLOAD)
    assert result.best.timings["reward.score"].pool is None
    assert "reward" not in result.best.to_placement_config()["roles"]
    assert "reward need no device" in result.explain()


def test_bad_inputs_are_actionable_errors():
    with pytest.raises(PlanningError, match="needs a model size"):
        plan_placement(grpo_graph(), Cluster(1, 8, "h100"), same_size("7b", ("ref",)),
                       PAPER_WORKLOAD)
    with pytest.raises(PlanningError, match="roles not in the graph"):
        plan_placement(grpo_graph(), Cluster(1, 8, "h100"), same_size("7b", ("actor", "critic")),
                       PAPER_WORKLOAD)
    out_of_order = TinyGraph([Node("b", "function", None, ("a",)), Node("a", "source", None)])
    with pytest.raises(PlanningError, match="topological order"):
        plan_placement(out_of_order, Cluster(1, 8, "h100"), {}, PAPER_WORKLOAD)


def test_drawing_shows_pools_roles_devices_and_layouts(split_result, tmp_path):
    source = plan_to_dot(split_result).source
    for pool in split_result.best.pools:
        label = f"pool {pool.name}: {pool.nodes} node(s) x {pool.devices_per_node} A100-80G"
        assert label in source
    actor = split_result.best.pool_of("actor")
    layout = actor.layouts["actor"]
    assert f"rollout dp={layout.dp} x tp={layout.tp}, FSDP over {actor.devices} devices" in source
    assert "critic: dp=64 tp=1" in source and "driver (no device)" in source
    path = tmp_path / "plan.dot"
    assert split_result.render(str(path)) == str(path) and "digraph" in path.read_text()
    with pytest.raises(RenderError, match="use one of"):
        split_result.render(str(tmp_path / "plan.jpeg"))


@pytest.mark.skipif(shutil.which("dot") is None, reason="graphviz `dot` not installed")
def test_drawing_renders_to_svg(split_result, tmp_path):
    path = tmp_path / "plan.svg"
    split_result.render(str(path))
    assert "<svg" in path.read_text()
