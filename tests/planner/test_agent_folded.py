"""Issue 26 class 13 (planner part): an agent rollout is served by the actor's worker
(docs/agents.md: it cannot be placed apart), so the planner gives it no model of its
own and never proposes a placement that puts it on another pool — swept over cluster
shapes, model sizes and `placement=auto`; and `placement=auto` plans its episodes at
their width (`agent.max_response_tokens`)."""
from __future__ import annotations

import os

import pytest

from hybridflow.commands.plan import device_roles, load_model_spec
from hybridflow.planner import Cluster, Workload, plan_placement
from hybridflow.program.assemble import load_plan, prepare
from hybridflow.program.async_planning import pipeline_view

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
AGENT = os.path.join(REPO, "graphs", "agent_grpo.py")
SHAPES = [(1, 8, "7b"), (2, 8, "7b"), (1, 4, "1.5b"), (4, 8, "32b")]


@pytest.mark.parametrize("nodes,gpus,size", SHAPES)
def test_the_agent_has_no_model_and_no_pool_of_its_own(nodes, gpus, size):
    view, pipeline = pipeline_view(load_plan(AGENT, []))
    assert device_roles(view) == ["actor"]  # agent.play is the actor's work
    result = plan_placement(view, Cluster(nodes, gpus, "h100-80g"),
                            {"actor": load_model_spec(size)},
                            Workload(256, 4, 512, 512), pipeline=pipeline)
    for candidate in [result.best, *result.candidates]:
        roles = [r for pool in candidate.pools for r in pool.roles]
        assert "agent" not in roles, candidate.label()
    assert "agent" not in result.models


def test_placement_auto_keeps_the_agent_with_the_actor_and_plans_its_width(monkeypatch):
    seen = {}
    import hybridflow.planner as planner

    real = planner.plan_placement

    def spy(plan, cluster, models, workload, **kw):
        seen["models"], seen["width"] = dict(models), workload.response_len
        return real(plan, cluster, models, workload, **kw)

    monkeypatch.setattr(planner, "plan_placement", spy)
    loaded = prepare(AGENT, ["placement=auto", "agent.max_response_tokens=96"],
                     preflight=False)
    assert set(seen["models"]) == {"actor"} and seen["width"] == 96
    assert loaded.plan.placement.roles["agent"] == loaded.plan.placement.roles["actor"]
