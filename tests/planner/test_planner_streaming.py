"""The streaming step of trainer.async_mode=streaming (hybridflow/planner/streaming.py):
producer (the stream side) against consumer (the train side + weight push), no barrier,
and the rollout/train device split the planner chooses by it."""
import math
import os

import pytest
from planner_brute import brute_force_best
from planner_graphs import a100, grpo_graph, same_size

from hybridflow.planner import Cluster, Pipeline, Workload, plan_placement
from hybridflow.planner.cost import CostModel
from hybridflow.planner.pipeline import apart_problem
from hybridflow.planner.problem import NodeInfo, build_problem
from hybridflow.planner.streaming import StreamingSchedule, StreamingStep

# what streaming_split.streaming_sides puts on the stream side of grpo_graph()
STREAM_SIDE = frozenset({"prompts", "actor.generate"})
STREAM = Pipeline(2, STREAM_SIDE, {"actor.generate": "rollout"}, streaming=True)
PIPELINED = Pipeline(2, STREAM_SIDE | {"ref.logprob", "reward.score", "advantages"},
                     {"actor.generate": "rollout"})
WORK = Workload(prompts=128, samples_per_prompt=8, prompt_len=512, response_len=4096,
                response_mean=1000)
ACTOR_REF = same_size("7b", ("actor", "ref"))


def plan(cluster, pipeline=STREAM, workload=WORK, **kw):
    return plan_placement(grpo_graph(), cluster, ACTOR_REF, workload, pipeline=pipeline, **kw)


# ------------------------------------------------------------ the model, by hand
def apart_nodes(gen_role="rollout") -> tuple[NodeInfo, ...]:
    """A GRPO step with the rollout apart and its weight push (export, load)."""
    return (NodeInfo("prompts", "source", None, ()),
            NodeInfo("gen", "generate", gen_role, ("prompts",)),
            NodeInfo("logprob", "inference", "actor", ("gen",)),
            NodeInfo("ref", "inference", "ref", ("gen",)),
            NodeInfo("update", "train", "actor", ("logprob", "ref")),
            NodeInfo("export", "sync", "actor", ("update",)),
            NodeInfo("load", "sync", gen_role, ("export",)))


POOLS = {"actor": 0, "ref": 1, "rollout": 2}
NAMES = ["actor", "ref", "gen"]
#          prompts gen logprob ref update export load
SECONDS = [0.0, 10.0, 2.0, 3.0, 4.0, 0.5, 0.25]


def test_apart_the_step_is_the_slower_of_producer_and_consumer_with_no_barrier():
    schedule = StreamingSchedule(apart_nodes(), POOLS, 3, frozenset({"prompts", "gen"}), 1.0)
    assert not schedule.inline
    # produce 10; consume = train side max(2, 3) + 4 = 7, + push 0.5 + 0.25, + fixed 1 = 8.75;
    # pools: actor 2 + 4 + 0.5 = 6.5, ref 3, gen 10 + 0.25 (the load pauses the engine)
    assert schedule.makespan(SECONDS) == pytest.approx(10.25)
    fast_gen = [0.0, 5.0, *SECONDS[2:]]
    assert schedule.makespan(fast_gen) == pytest.approx(8.75)  # now the consumer's pace
    # the pipelined step of the same plan pays a barrier: max(10, 7, 6) + 0.75 (+ fixed)
    from hybridflow.planner.pipeline import PipelinedSchedule
    pipelined = PipelinedSchedule(apart_nodes(), POOLS, 3, frozenset({"prompts", "gen"}))
    assert pipelined.makespan(SECONDS) + 1.0 == pytest.approx(11.75)


def test_the_terms_name_the_bottleneck_and_each_sides_busy_fraction():
    from hybridflow.planner.streaming import streaming_step
    schedule = StreamingSchedule(apart_nodes(), POOLS, 3, frozenset({"prompts", "gen"}), 1.0)
    _, path, slow = streaming_step(schedule, SECONDS, NAMES, 2, 30.0, {"rollout": "actor"}, 64)
    assert slow.step == pytest.approx(10.25) and slow.bottleneck == "rollout"
    assert slow.pool_bound and slow.rollout_pools == ("gen",) and "gen" in path
    busy = slow.busy_fraction()
    assert busy["rollout side"] == pytest.approx(10 / 10.25)
    assert busy["train side"] == pytest.approx(8.75 / 10.25)
    assert busy["pool actor"] == pytest.approx(6.5 / 10.25)
    assert slow.rate() == pytest.approx(6.4)  # 64 samples in 10 s
    timings, path, fast = streaming_step(schedule, [0.0, 5.0, *SECONDS[2:]], NAMES, 2, 30.0,
                                         {"rollout": "actor"}, 64)
    assert fast.bottleneck == "train" and fast.step == pytest.approx(8.75)
    assert fast.busy_fraction()["rollout side"] == pytest.approx(5 / 8.75)
    assert path == ["ref", "update", "export", "load"]  # the consumer's chain, then the push
    assert timings["export"].start == pytest.approx(7.0)  # the push follows the train side
    assert "no barrier" in fast.describe() and "train side" in fast.bound_by


def test_a_rollout_sharing_the_actors_module_takes_turns_with_training():
    nodes = apart_nodes("actor")[:5]  # folded: no own weights, no push
    schedule = StreamingSchedule(nodes, {"actor": 0, "ref": 1}, 2,
                                 frozenset({"prompts", "gen"}), 1.0)
    assert schedule.inline
    assert schedule.makespan(SECONDS[:5]) == pytest.approx(10 + 7 + 1)
    terms = StreamingStep(2, 10.0, 7.0, {"actor": 16.0}, 0.0, 18.0, fixed=1.0, inline=True)
    assert terms.step == pytest.approx(18.0) and terms.bottleneck == "both"


def test_streaming_generation_pays_no_per_batch_tail():
    """The engine refills a finished slot with the next batch's request: a replica's
    share costs m x mean / batch decode steps at up to (k + 1) m in flight."""
    stream = CostModel(build_problem(grpo_graph(), a100(8), ACTOR_REF, WORK, pipeline=STREAM))
    batch = CostModel(build_problem(grpo_graph(), a100(8), ACTOR_REF, WORK,
                                    pipeline=PIPELINED))
    free = 60 * 2**30
    streamed, whole = (c.generate_cost("actor", 8, 1, free) for c in (stream, batch))
    per_replica = math.ceil(WORK.sequences / 8)
    assert streamed.decode_steps == pytest.approx(per_replica * 1000 / streamed.batch)
    assert streamed.batch >= whole.batch and streamed.decode_steps < whole.decode_steps
    assert streamed.seconds < whole.seconds


# ------------------------------------------------------------ the choice
def test_placement_auto_splits_the_devices_by_the_producer_consumer_model():
    result = plan(a100(32))
    best = result.best
    assert best.pipeline.kind == "streaming" and best.pipeline.own_weights == {"rollout": "actor"}
    rollout = best.pool_of("rollout")
    assert rollout.roles == ("rollout",) and rollout.devices == 8
    assert best.grouping == (("actor", "ref"), ("rollout",))
    s = best.node_seconds
    # the train side, actor and ref on one pool: log-probs, reference, update in turn
    train_side = s["actor.logprob"] + s["ref.logprob"] + s["actor.update"]
    push = s["weight_export"] + s["weight_sync"]
    fixed = result.cluster.spec.efficiency.step_overhead_s
    produce = s["actor.generate"]
    rollout_pool = produce + s["weight_sync"]
    assert best.pipeline.train_side == pytest.approx(train_side)
    assert best.step_seconds == pytest.approx(max(produce, train_side + push + fixed,
                                                  rollout_pool, *best.pipeline.pool_busy.values()))
    assert best.pipeline.bottleneck == "rollout"
    # the streaming step is never worse than the pipelined one on the same cluster here
    assert best.step_seconds < plan(a100(32), PIPELINED).best.step_seconds
    text = result.explain()
    assert "Streaming: a step takes max(rollout side" in text
    assert "8 device(s) generating, 24 training" in text
    assert "bottleneck: the rollout side (the train side waits" in text
    assert f"busy: rollout side {100 * best.pipeline.busy_fraction()['rollout side']:.0f}%" \
        in text
    data = result.to_json()
    assert data["pipeline"]["mode"] == "streaming"
    assert data["best"]["pipeline"]["bottleneck"] == "rollout"
    assert data["best"]["placement"]["pools"][rollout.name]["devices_per_node"] == 8


def test_where_splitting_starves_training_the_rollout_stays_with_the_actor():
    result = plan(a100(8))
    assert result.best.colocated and result.best.pipeline.inline
    assert result.rollout_apart.step_seconds > result.best.step_seconds
    assert "loses to the rollout sharing the actor's devices" in result.explain()
    assert "generation and training in turn" in result.explain()


@pytest.mark.parametrize("cluster", [a100(8), Cluster(2, 2, "h100-80g"), a100(16)],
                         ids=["8 a100", "2x2", "16 a100"])
def test_search_with_pruning_finds_the_brute_force_best_streaming_plan(cluster):
    problem = build_problem(grpo_graph(), cluster, ACTOR_REF, WORK, pipeline=STREAM)
    expected = min(brute_force_best(problem), brute_force_best(apart_problem(problem)))
    assert plan(cluster).best.step_seconds == pytest.approx(expected)


def test_hybridflow_plan_models_a_streaming_run_of_the_real_graph(capsys):
    from hybridflow.cli import main
    grpo = os.path.join(os.path.dirname(__file__), "..", "..", "graphs", "grpo.py")
    code = main(["plan", grpo, "--model", "7b", "--nodes", "4", "--prompts", "128",
                 "--samples", "8", "--prompt-len", "512", "--response-len", "4096",
                 "--response-mean", "1000", "trainer.staleness=2",
                 "trainer.async_mode=streaming", "actor.off_policy=decoupled"])
    out = capsys.readouterr().out
    assert code == 0
    assert "async streaming, staleness 2" in out and "Streaming: a step takes" in out
    assert "bottleneck: the" in out and "busy: rollout side" in out


def test_the_plan_drawing_says_the_step_streams():
    from hybridflow.planner.render import plan_to_dot
    source = plan_to_dot(plan(a100(32))).source
    assert "async streaming staleness 2" in source and "weight_sync" in source
