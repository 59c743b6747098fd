"""A folded role (the reference of a LoRA actor) in placement, plan, summary and drawing:
it joins its host's pool, the plan says who serves it, and a split placement fails
before launch."""
import os

import pytest

from hybridflow.program.assemble import prepare
from hybridflow.plan.compiler import GraphError
from hybridflow.draw.graph import plan_to_dot

GRPO = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                    "graphs", "grpo.py")


def test_lora_folds_the_reference_into_the_actor():
    plan = prepare(GRPO, ["actor.lora.rank=8"]).plan
    assert plan.placement.folded == {"ref": "actor", "rollout": "actor"}
    assert plan.node("ref.logprob").pool == plan.node("actor.update").pool
    assert "folded: ref is served by actor's worker" in plan.summary()
    assert "ref→actor@main" in plan.summary()
    assert prepare(GRPO, []).plan.placement.folded == {"rollout": "actor"}  # colocated rollout
    own_reference = f"ref.path={os.path.dirname(GRPO)}/assets/toy_base"
    assert prepare(GRPO, ["actor.lora.rank=8", own_reference]).plan.placement.folded == \
        {"rollout": "actor"}


def test_an_unplaced_reference_follows_its_host_to_its_pool():
    plan = prepare(GRPO, ["actor.lora.rank=8", "placement.pools.gen.nodes=1",
                          "placement.roles.actor=gen"]).plan
    assert plan.placement.roles["ref"] == "gen"


def test_a_reference_placed_apart_from_its_host_fails_before_launch():
    with pytest.raises(GraphError, match=r"'ref' is served by role 'actor'.*pool 'other'.*"
                                         r"ref.path"):
        prepare(GRPO, ["actor.lora.rank=8", "placement.pools.other.nodes=1",
                       "placement.roles.ref=other"])


def test_render_plan_draws_the_reference_inside_the_actor_worker():
    plan = prepare(GRPO, ["actor.lora.rank=8"]).plan
    source = plan_to_dot(plan, show_plan=True).source
    host = source[source.index("subgraph cluster_host_actor"):]
    host = host[:host.index("}")]
    assert "actor worker · also serves ref" in host
    assert '"ref.logprob"' in host and "served by actor" in host and '"actor.update"' in host
    assert "ref (served by actor)" in source  # the pool label
    assert "cluster_host" not in plan_to_dot(plan).source  # no placement, no worker box
