"""The pipelined step of trainer.staleness >= 1, the rollout apart, and the choice between them."""
import pytest
from planner_brute import brute_force_best
from planner_graphs import a100, grpo_graph, same_size

from hybridflow.planner import Cluster, Pipeline, PlanningError, Workload, plan_placement
from hybridflow.planner.cost import CostModel
from hybridflow.planner.pipeline import apart_problem
from hybridflow.planner.problem import build_problem
from hybridflow.planner.rollout import export_seconds, load_seconds, switch_seconds

# what async_split.split_sides(plan, 1) puts ahead of training in grpo_graph()
AHEAD = frozenset({"prompts", "actor.generate", "ref.logprob", "reward.score", "advantages"})
PIPELINE = Pipeline(1, AHEAD, {"actor.generate": "rollout"})
# generation bound by its long tail: more devices barely shorten it
LONG_TAIL = Workload(prompts=128, samples_per_prompt=8, prompt_len=512, response_len=4096,
                     response_mean=1000)
ACTOR_REF = same_size("7b", ("actor", "ref"))


def plan(cluster, workload=LONG_TAIL, pipeline=PIPELINE, models=ACTOR_REF):
    return plan_placement(grpo_graph(), cluster, models, workload, pipeline=pipeline)


def test_pipelined_step_is_the_max_of_sides_and_pools_plus_the_weight_sync():
    result = plan(a100(16))
    best = result.best
    assert best.pipeline.own_weights == {"rollout": "actor"}  # the rollout apart wins here
    s, pool = best.node_seconds, {n: t.pool for n, t in best.timings.items()}
    # by hand, from the same per-node seconds: each side alone, each pool on both sides
    rollout_side = s["actor.generate"] + max(s["ref.logprob"],
                                             s["reward.score"] + s["advantages"])
    train_side = s["actor.logprob"] + s["actor.update"]
    busy = {p.name: sum(s[n] for n in s if pool[n] == p.name and not n.startswith("weight_"))
            for p in best.pools}
    sync = s["weight_export"] + s["weight_sync"]
    fixed = result.cluster.spec.efficiency.step_overhead_s
    assert best.step_seconds == pytest.approx(
        max(rollout_side, train_side, *busy.values()) + sync + fixed)
    assert best.pipeline.pool_busy == pytest.approx(busy)
    assert sync > 0 and pool["weight_export"] == best.pool_of("actor").name
    assert pool["weight_sync"] == pool["actor.generate"] == best.pool_of("rollout").name
    assert best.step_seconds < best.pipeline.synchronous  # the overlap pays


def test_a_rollout_apart_pays_the_weight_sync_instead_of_the_engine_switch():
    problem = build_problem(grpo_graph(), a100(16), ACTOR_REF, LONG_TAIL, pipeline=PIPELINE)
    apart = apart_problem(problem)
    folded, own = CostModel(problem), CostModel(apart)
    model = problem.models["actor"]
    free = 60 * 2**30
    shared_gen = folded.generate_cost("actor", 8, 1, free).seconds
    apart_gen = own.generate_cost("rollout", 8, 1, free).seconds
    from hybridflow.planner.formulas import Layout
    assert shared_gen - apart_gen == pytest.approx(switch_seconds(folded, model, 8, Layout(8, 1)))
    assert own.role_cost("actor", 8, 1).node_seconds["weight_export"] == pytest.approx(
        export_seconds(own, "actor", 8))
    assert own.role_cost("rollout", 8, 1).node_seconds["weight_sync"] == pytest.approx(
        load_seconds(own, "rollout"))
    # the whole bf16 model crosses between pools: over the NIC it is slower than NVLink
    one_node = CostModel(apart_problem(build_problem(grpo_graph(), a100(8), ACTOR_REF, LONG_TAIL,
                                                     pipeline=PIPELINE)))
    assert load_seconds(own, "rollout") > load_seconds(one_node, "rollout") > 0


def test_colocated_async_step_is_longer_than_the_split_one_when_generation_dominates():
    result = plan(a100(16))
    colocated, split = result.colocated, result.rollout_apart
    assert split.label() == result.best.label()
    assert colocated.step_seconds > split.step_seconds
    # colocated, generation and the actor's passes share one pool: no overlap left to use
    terms = colocated.pipeline
    assert terms.busiest[1] >= max(terms.rollout_side, terms.train_side)
    assert terms.busiest[1] >= colocated.node_seconds["actor.generate"] + \
        colocated.node_seconds["actor.update"]


def test_colocated_wins_where_splitting_halves_the_actors_devices():
    """One node of 8: the rollout apart leaves the actor 4 devices, and its update doubles."""
    result = plan(a100(8))
    assert not result.best.pipeline.own_weights
    apart = result.rollout_apart
    assert apart is not None and apart.step_seconds > result.best.step_seconds
    assert apart.pool_of("actor").devices == 4
    assert apart.pipeline.bound_by.startswith(f"pool {apart.pool_of('actor').name}")


def test_no_device_apart_means_no_split():
    result = plan(Cluster(1, 1, "h200-141g"), Workload(8, 2, 64, 64),
                  models=same_size("1.5b", ("actor", "ref")))
    assert result.rollout_apart is None and result.best.colocated
    assert "No plan with the rollout on a pool of its own fits" in result.explain()


def test_staleness_zero_plans_have_no_pipeline_and_no_rollout_apart():
    sync = plan(a100(16), pipeline=None)
    assert sync.best.pipeline is None and sync.rollout_apart is None
    assert all("rollout" not in c.pool_of("actor").roles for c in sync.ranked)
    assert "Async" not in sync.explain()
    pipelined = plan(a100(16))
    # the same colocated plan, pipelined, is never slower than synchronous
    assert pipelined.colocated.step_seconds <= sync.colocated.step_seconds
    assert pipelined.colocated.pipeline.synchronous == pytest.approx(sync.colocated.step_seconds)


def test_the_explanation_says_why_the_split_wins_with_the_numbers():
    result = plan(a100(16))
    text = result.explain()
    split, shared = result.rollout_apart, result.rollout_shared
    assert "async, staleness 1" in text
    assert f"Async: a step takes {split.pipeline.describe()}" in text
    assert (f"The rollout on a pool of its own ({split.label()}, {split.step_seconds:.1f} s) "
            f"beats the rollout sharing the actor's devices ({shared.label()}, "
            f"{shared.step_seconds:.1f} s)") in text
    gen = shared.node_seconds["actor.generate"]
    assert f"generates ({gen:.1f} s)" in text
    assert f"the weights sync in {split.pipeline.sync:.1f} s" in text
    data = result.to_json()
    assert data["best"]["pipeline"]["own_weights"] == {"rollout": "actor"}
    assert data["best"]["placement"]["roles"]["rollout"] != data["best"]["placement"]["roles"][
        "actor"]
    loses = plan(a100(8)).explain()
    assert "loses to the rollout sharing the actor's devices" in loses


def test_a_pipeline_naming_unknown_or_non_generate_nodes_is_refused():
    with pytest.raises(PlanningError, match="does not have"):
        plan(a100(8), pipeline=Pipeline(1, frozenset({"nope"})))
    with pytest.raises(PlanningError, match="only a rollout-side generate node"):
        plan(a100(8), pipeline=Pipeline(1, AHEAD, {"ref.logprob": "rollout"}))
    with pytest.raises(PlanningError, match="staleness >= 1"):
        Pipeline(0, AHEAD)


@pytest.mark.parametrize("cluster", [a100(8), Cluster(2, 2, "h100-80g"), a100(16)],
                         ids=["8 a100", "2x2 h100", "16 a100"])
def test_search_with_pruning_finds_the_brute_force_best_pipelined_plan(cluster):
    problem = build_problem(grpo_graph(), cluster, ACTOR_REF, LONG_TAIL, pipeline=PIPELINE)
    expected = min(brute_force_best(problem), brute_force_best(apart_problem(problem)))
    assert plan(cluster).best.step_seconds == pytest.approx(expected)


def test_given_groupings_place_the_rollout_apart_where_they_name_it():
    """A measured async run's own placement (run_dir.read_run): rollout on its own pool."""
    apart = plan_placement(grpo_graph(), a100(16), ACTOR_REF, LONG_TAIL, pipeline=PIPELINE,
                           groupings=[(("actor", "ref"), ("rollout",))])
    assert apart.best.grouping == (("actor", "ref"), ("rollout",))
    assert apart.best.pipeline.own_weights == {"rollout": "actor"}
    assert apart.rollout_shared is None
    shared = plan_placement(grpo_graph(), a100(16), ACTOR_REF, LONG_TAIL, pipeline=PIPELINE,
                            groupings=[(("actor", "ref"),)])
    assert shared.best.colocated and not shared.best.pipeline.own_weights
    assert shared.rollout_apart is None


def test_the_drawing_of_a_split_plan_shows_the_rollout_role_and_its_weight_sync():
    from hybridflow.planner.render import plan_to_dot
    source = plan_to_dot(plan(a100(16))).source
    assert "async staleness 1" in source
    rollout_box = source[source.index("subgraph cluster_role_rollout"):]
    rollout_box = rollout_box[:rollout_box.index("}")]
    assert "actor.generate" in rollout_box and "weight_sync" in rollout_box
    assert "weight_export -> weight_sync" in source
