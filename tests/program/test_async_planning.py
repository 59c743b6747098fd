"""The planner's view of an async run: sides from the compiler, rollouts folded, movable."""
import os

from hybridflow.program.async_planning import pipeline_view
from hybridflow.plan.async_split import sides_of
from hybridflow.program.assemble import load_plan
from hybridflow.plan.weight_sync import planner_view

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GRPO = os.path.join(REPO, "graphs", "grpo.py")
ASYNC = ["trainer.staleness=1", "trainer.allow_uncorrected_async=true"]
APART = ["runtime.name=ray", "placement.pools.gen.devices_per_node=1",
         "placement.roles.rollout=gen"]


def test_synchronous_plans_get_the_plain_planner_view_and_no_pipeline():
    plan = load_plan(GRPO)
    view, pipeline = pipeline_view(plan)
    assert pipeline is None
    assert [(n.name, n.role) for n in view.nodes] == [(n.name, n.role)
                                                      for n in planner_view(plan).nodes]


def test_async_plans_name_the_compilers_rollout_side_and_the_movable_generate_node():
    plan = load_plan(GRPO, ASYNC)
    view, pipeline = pipeline_view(plan)
    assert pipeline.staleness == 1
    assert pipeline.rollout_side == frozenset(sides_of(plan).rollout)
    assert pipeline.movable == {"rollout.generate": "rollout"}
    assert {n.role for n in view.nodes if n.role} == {"actor", "ref", "reward"}  # folded


def test_a_rollout_the_config_placed_apart_is_folded_back_for_the_planner_to_decide():
    plan = load_plan(GRPO, ASYNC + APART)
    assert {"weight_export", "weight_sync"} <= {n.name for n in plan.nodes}
    view, pipeline = pipeline_view(plan)
    names = {n.name for n in view.nodes}
    assert not names & {"weight_export", "weight_sync"}  # the planner costs its own sync
    assert view.nodes[[n.name for n in view.nodes].index("rollout.generate")].role == "actor"
    assert pipeline.movable == {"rollout.generate": "rollout"}
    assert pipeline.rollout_side <= names


def test_staleness_given_explicitly_wins_over_the_plans_own():
    """placement=auto plans before the compiler attaches the sides: it passes k itself."""
    plan = load_plan(GRPO)
    _, pipeline = pipeline_view(plan, staleness=2)
    assert pipeline.staleness == 2 and "rollout.generate" in pipeline.rollout_side


STREAMING = ["trainer.staleness=2", "trainer.async_mode=streaming", "actor.off_policy=decoupled"]


def test_streaming_plans_give_the_planner_the_stream_side_and_say_they_stream():
    """The stream side is the source, the generate node and (trainer.stream_side=auto,
    all roles on one pool) the reward, reference and advantages (streaming_split.py);
    with generate_only the rewards and the reference are the train side's."""
    plan = load_plan(GRPO, STREAMING)
    _, pipeline = pipeline_view(plan)
    assert pipeline.streaming and pipeline.staleness == 2
    assert pipeline.rollout_side == frozenset({"prompts", "rollout.generate", "reward.score",
                                               "grpo_advantages", "ref.logprob"})
    assert pipeline.movable == {"rollout.generate": "rollout"}
    only = pipeline_view(load_plan(GRPO, STREAMING + ["trainer.stream_side=generate_only"]))[1]
    assert only.rollout_side == frozenset({"prompts", "rollout.generate"})
    pipelined = pipeline_view(load_plan(GRPO, ["trainer.staleness=2"] + STREAMING[2:]))[1]
    assert not pipelined.streaming and "ref.logprob" in pipelined.rollout_side
    # placement=auto plans before the buffers exist: the mode is passed with k
    _, auto = pipeline_view(load_plan(GRPO), staleness=2, mode="streaming")
    assert auto.streaming and auto.rollout_side == pipeline.rollout_side
