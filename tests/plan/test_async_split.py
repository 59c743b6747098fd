"""The async split (hybridflow/plan/async_split.py): which nodes run ahead of training on
each shipped graph, the refusals before launch (an impossible split, a graph with
nothing to generate, an uncorrected update), and the order of the async step."""
from __future__ import annotations

import os
import textwrap

import pytest

from hybridflow.plan.async_split import READY, iteration_plans, split_sides
from hybridflow.plan.compiler import GraphError
from hybridflow.program.assemble import prepare

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FAKES = os.path.join(REPO, "tests", "support", "fakes.py")
FAKE_BINDINGS = [f"workers.actor={FAKES}:FakeActor", f"workers.ref={FAKES}:FakeReference",
                 f"workers.reward={FAKES}:FakeReward"]
ASYNC = ["trainer.staleness=1", "trainer.allow_uncorrected_async=true"]
SPLIT_ROLLOUT = ["placement.pools.gen.devices_per_node=1", "placement.roles.rollout=gen"]


def graph_file(name: str) -> str:
    return os.path.join(REPO, "graphs", f"{name}.py")


def plan_of(name: str, *overrides: str):
    return prepare(graph_file(name), list(overrides), preflight=False).plan


# ------------------------------------------------------------- the shipped graphs
# The rollout side: the sources, the generation, and what depends only on them
# without reading a trained role's current weights (rewards, reference log-probs,
# group advantages, DAPO's filter and gather). The train side: what reads the
# trained weights (the actor's log-probs, the critic's values) and what follows.
SHIPPED = {
    "grpo": (("prompts", "rollout.generate", "reward.score", "grpo_advantages",
              "ref.logprob"), ("actor.logprob", "actor.update")),
    "ppo": (("prompts", "rollout.generate", "ref.logprob", "reward.score"),
            ("actor.logprob", "critic.values", "kl_in_reward", "gae_advantages",
             "critic.update", "actor.update")),
    "rloo": (("prompts", "rollout.generate", "reward.score", "rloo_advantages"),
             ("actor.logprob", "actor.update")),
    "reinforce_pp": (("prompts", "rollout.generate", "ref.logprob", "reward.score"),
                     ("actor.logprob", "kl_in_reward", "reinforce_pp_advantages",
                      "actor.update")),
    "remax": (("prompts", "greedy", "baseline", "repeat_baseline", "rollout.generate",
               "reward.score", "scores_to_rewards", "remax_advantages"),
              ("actor.logprob", "actor.update")),
    "dapo": (("prompts", "rollout.generate", "reward.score", "overlong_penalty",
              "drop_uniform_groups", "gather", "grpo_advantages"),
             ("actor.logprob", "actor.update")),
    "agent_grpo": (("prompts", "agent.play", "grpo_advantages"),
                   ("actor.logprob", "actor.update")),
}


@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_split_of_each_shipped_graph(name):
    plan = plan_of(name)
    assert plan.sides is None  # staleness 0: no split
    sides = split_sides(plan, 1)
    rollout, train = SHIPPED[name]
    assert (sides.rollout, sides.train, sides.staleness) == (rollout, train, 1)
    # every node on exactly one side; what the train side reads is handed over
    assert sorted(sides.rollout + sides.train) == sorted(n.name for n in plan.nodes)
    assert {a for a, _ in sides.crossing_edges(plan)} == set(sides.handoff)


def test_dapo_hands_over_the_gathered_rows_not_the_raw_generation():
    sides = split_sides(plan_of("dapo"), 1)
    assert sides.handoff == ("gather", "grpo_advantages")


def test_a_split_rollout_puts_the_weight_sync_on_the_train_side():
    plan = plan_of("grpo", *ASYNC, *SPLIT_ROLLOUT)
    assert plan.sides.train == ("actor.logprob", "actor.update", "weight_export",
                                "weight_sync")
    assert ("rollout.generate", "actor.update") in plan.sides.crossing_edges(plan)
    assert "async: trainer.staleness=1" in plan.summary()
    assert "rollout side: prompts, rollout.generate" in plan.summary()


@pytest.mark.parametrize("name", ["sft", "agent_sft"])
def test_a_graph_without_generation_is_refused(name):
    with pytest.raises(GraphError, match=f"graph '{name}' has no generate node; set "
                                         f"trainer.staleness=0"):
        plan_of(name, *ASYNC)


@pytest.mark.parametrize("name", ["grpo", "ppo", "agent_grpo"])
def test_an_uncorrected_update_is_refused_unless_opted_out(name):
    with pytest.raises(GraphError) as err:
        plan_of(name, "trainer.staleness=1")
    message = str(err.value)
    assert "node 'actor.update'" in message and "no off-policy correction" in message
    assert "actor.off_policy=tis" in message and "allow_uncorrected_async=true" in message
    assert plan_of(name, *ASYNC).sides is not None


# ------------------------------------------------------------- impossible splits
def write(tmp_path, body: str) -> str:
    path = tmp_path / "graph.py"
    path.write_text(textwrap.dedent(body))
    return str(path)


TRAINED = """
    from hybridflow import Graph
    from hybridflow.graph.builder import node_fn


    @node_fn(reads=("scores", "response_mask"), writes=("advantages",))
    def advantages(batch): ...


    def build(cfg):
        g = Graph("{name}")
        rollout = g.call("actor.generate", g.source("prompts"), n=1)
        old = g.call("actor.logprob", rollout)
        adv = g.fn(advantages, rollout, g.call("reward.score", rollout))
        g.call("actor.update", rollout, old, adv)
        {extra}
        return g
"""
# a second generation fed by the actor's current log-probs: it cannot run ahead
REGENERATE = TRAINED.format(name="regenerate", extra='g.call("actor.generate", '
                            'g.source("more_prompts"), old, name="regenerate", n=1)')
# more rows of a train-side node: the gather would re-run training
GATHER_BEHIND = TRAINED.format(name="gather_behind",
                               extra='g.gather(old, until=4, max_rounds=2, name="more")')


def test_a_generation_fed_by_the_train_side_is_refused_naming_it(tmp_path):
    with pytest.raises(GraphError) as err:
        prepare(write(tmp_path, REGENERATE), FAKE_BINDINGS + ASYNC, preflight=False)
    message = str(err.value)
    assert "node 'regenerate'" in message and "reads 'actor.logprob'" in message
    assert "trainer.staleness=0" in message


def test_a_gather_of_train_side_rows_is_refused_naming_it(tmp_path):
    with pytest.raises(GraphError, match=r"node 'more'.*re-runs nodes of the train side"):
        prepare(write(tmp_path, GATHER_BEHIND), FAKE_BINDINGS + ASYNC, preflight=False)


def test_the_same_graphs_compile_synchronously(tmp_path):
    for body in (REGENERATE, GATHER_BEHIND):
        assert prepare(write(tmp_path, body), FAKE_BINDINGS, preflight=False).plan.sides \
            is None


# ------------------------------------------------------------- the async step
def test_an_agent_on_the_actors_engine_samples_with_the_actors_weights():
    """agent.play is served by the actor's worker: the update waits for the episodes
    of step t + k before changing the weights they are played with."""
    both = iteration_plans(plan_of("agent_grpo", *ASYNC)).both
    assert "agent.play" in both.node("actor.update").deps


def test_the_async_step_queues_training_that_waits_for_nothing_first():
    """Workers run tasks in the order the scheduler submits them (plan order): the
    train side's first passes must not queue behind a reward waiting for generation."""
    both = iteration_plans(plan_of("grpo", *ASYNC, *SPLIT_ROLLOUT)).both
    order = [n.name for n in both.nodes]
    assert order.index("actor.logprob") < order.index("reward.score")
    assert order.index("actor.update") < order.index("ref.logprob")
    # the weight sync still waits for the generation of step t + k (exact versions)
    assert "rollout.generate" in both.node("weight_sync").deps
    assert both.node("actor.logprob").deps == (READY + "rollout.generate",)
    seen = set()
    for node in both.nodes:  # still in topological order
        assert set(node.deps) <= seen, node.name
        seen.add(node.name)


def test_a_colocated_update_waits_for_the_generation_it_shares_weights_with():
    both = iteration_plans(plan_of("ppo", *ASYNC)).both
    order = [n.name for n in both.nodes]
    assert "rollout.generate" in both.node("actor.update").deps
    assert order.index("critic.update") < order.index("rollout.generate")


def test_a_trained_role_generating_itself_runs_its_generation_ahead(tmp_path):
    """`actor.generate` (no rollout role): the generation is on the rollout side, its
    update is refused uncorrected and, opted out, waits for the generation ahead."""
    path = write(tmp_path, TRAINED.format(name="self_generating", extra=""))
    plan = prepare(path, FAKE_BINDINGS + ASYNC, preflight=False).plan
    assert plan.sides.rollout == ("prompts", "actor.generate", "reward.score", "advantages")
    assert plan.sides.train == ("actor.logprob", "actor.update")
    assert "actor.generate" in iteration_plans(plan).both.node("actor.update").deps
    with pytest.raises(GraphError, match="node 'actor.update'.*no off-policy correction"):
        prepare(path, FAKE_BINDINGS + ["trainer.staleness=1"], preflight=False)


STATEFUL_GRAPH = '''
from hybridflow import Graph, node_fn
from hybridflow.core.batch import Batch
from graphs import ops
from graphs.common import embedded_defaults


class RunningScale:
    """Divides scores by a running mean of their magnitude: state across steps."""

    def __init__(self):
        self.mean, self.__name__ = 1.0, "running_scale"
        node_fn(reads=("scores",), writes=("scores",), overwrites=("scores",))(self)

    def __call__(self, batch):
        self.mean = 0.9 * self.mean + 0.1 * float(batch["scores"].abs().mean())
        return Batch({"scores": batch["scores"] / max(self.mean, 1e-3)})

    def state_dict(self):
        return {"mean": self.mean}

    def load_state_dict(self, state):
        self.mean = state["mean"]


def defaults():
    return embedded_defaults(rollout={"n": 4})


def build(cfg):
    g = Graph("stateful")
    rollout = g.call("rollout.generate", g.source("prompts"), n=cfg.rollout.n)
    scaled = g.fn(RunningScale(), g.call("reward.score", rollout))
    adv = g.fn(ops.grpo_advantages, rollout, scaled)
    g.call("actor.update", rollout, g.call("actor.logprob", rollout), adv,
           loss=ops.policy_loss(cfg.actor))
    return g
'''


def test_a_function_node_with_state_stays_on_the_train_side(tmp_path):
    """It then sees each batch once, in step order: a resume that re-draws the queued
    batches would otherwise count them twice in its checkpointed state."""
    path = tmp_path / "stateful.py"
    path.write_text(STATEFUL_GRAPH)
    plan = prepare(str(path), [*ASYNC], preflight=False).plan
    assert plan.sides.rollout == ("prompts", "rollout.generate", "reward.score")
    assert plan.sides.train[:2] == ("running_scale", "grpo_advantages")
