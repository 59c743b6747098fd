"""The async split (hybridflow/plan/async_split.py): which nodes run ahead of training on
each shipped graph, the refusals before launch (an impossible split, a graph with
nothing to generate, an uncorrected update), and the one plan's BUFFER nodes."""
from __future__ import annotations

import os
import textwrap

import pytest

from hybridflow.plan.async_split import (BUFFER_PREFIX, BufferSpec, check_buffers, sides_of,
                                         split_sides, without_buffers)
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
    # the graph's own nodes: remax's defaults make one optimizer step per batch, where
    # the compiler would remove actor.logprob (plan/unneeded.py)
    plan = plan_of(name, "trainer.keep_unneeded_passes=true")
    assert sides_of(plan) is None  # staleness 0: no split, no buffer
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
    assert sides_of(plan).train == ("actor.logprob", "actor.update", "weight_export",
                                "weight_sync")
    assert ("rollout.generate", "actor.update") in sides_of(plan).crossing_edges(plan)
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
    assert sides_of(plan_of(name, *ASYNC)) is not None


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
        assert sides_of(prepare(write(tmp_path, body), FAKE_BINDINGS,
                                preflight=False).plan) is None


# ------------------------------------------------------------- the buffers
@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_one_plan_with_a_buffer_on_each_crossing_edge(name):
    """The async plan is the graph's plan with a BUFFER node after each rollout-side
    node the train side reads; the sides read back from it are the split's."""
    sync, plan = plan_of(name), plan_of(name, *ASYNC)
    split = split_sides(sync, 1)
    buffers = [n for n in plan.nodes if n.op == "buffer"]
    assert [b.name for b in buffers] == [BUFFER_PREFIX + n for n in split.handoff]
    for b in buffers:
        assert b.kind == "buffer" and b.buffer.capacity == 1 and b.buffer.max_staleness == 1
        assert b.deps == (b.buffer.producer,)
        assert b.output_keys == sync.node(b.buffer.producer).output_keys
    read_back = sides_of(plan)
    assert (read_back.rollout, read_back.train) == (split.rollout, split.train)
    for node in plan.nodes:  # the train side reads the buffers, never the producers
        if node.name in split.train:
            assert not set(node.deps) & set(split.rollout), node.name
    # without the buffers it is the graph's plan again
    assert [(n.name, n.deps) for n in without_buffers(plan).nodes] == \
        [(n.name, n.deps) for n in sync.nodes]
    seen = set()
    for node in plan.nodes:  # topological order
        assert set(node.deps) <= seen, node.name
        seen.add(node.name)


def test_a_buffer_admits_a_prompts_samples_whole():
    """The unit of the generation's buffer is the prompt group (uid): a GRPO group
    is admitted whole; DAPO's gathered rows too."""
    plan = plan_of("grpo", *ASYNC)
    assert plan.node(BUFFER_PREFIX + "rollout.generate").buffer.unit == "uid"
    assert plan_of("dapo", *ASYNC).node(BUFFER_PREFIX + "gather").buffer.unit == "uid"
    assert "capacity 1, unit uid, admits policy_version >= trained - 1" in plan.summary()


def test_the_compiler_refuses_a_bad_buffer_naming_it():
    from dataclasses import replace
    plan = plan_of("grpo", *ASYNC)
    name = BUFFER_PREFIX + "rollout.generate"
    node = plan.node(name)
    bad = [replace(node, buffer=BufferSpec("rollout.generate", 1, "no_such_key", 1))
           if n.name == name else n for n in plan.nodes]
    problems = check_buffers(replace(plan, nodes=bad))
    assert len(problems) == 1 and f"node '{name}'" in problems[0]
    assert "unit 'no_such_key' is not a column of 'rollout.generate'" in problems[0]
    zero = [replace(node, buffer=BufferSpec("rollout.generate", 0, "uid", 0))
            if n.name == name else n for n in plan.nodes]
    assert any("capacity 0 is the synchronous plan" in p
               for p in check_buffers(replace(plan, nodes=zero)))
    trained = [replace(node, deps=("actor.logprob",),
                       buffer=BufferSpec("actor.logprob", 1, None, 1))
               if n.name == name else n for n in plan.nodes]
    assert any("reads the current weights of trained role 'actor'" in p
               for p in check_buffers(replace(plan, nodes=trained)))


def test_an_agent_on_the_actors_engine_samples_with_the_actors_weights():
    """agent.play is served by the actor's worker: in a pass that also plays the
    episodes of step t + k, the update waits for them before changing the weights."""
    assert plan_of("agent_grpo", *ASYNC).node("actor.update").after == ("agent.play",)


def test_the_weight_sync_waits_for_the_generation_of_its_pass():
    """Exact versions: the weight sync into a split rollout runs after the generation
    in the same pass; the train side reads the buffer, not the generation."""
    plan = plan_of("grpo", *ASYNC, *SPLIT_ROLLOUT)
    assert plan.node("weight_sync").after == ("rollout.generate",)
    assert plan.node("actor.update").after == ()  # the rollout has its own weights
    assert plan.node("actor.logprob").deps == (BUFFER_PREFIX + "rollout.generate",)


def test_a_colocated_update_waits_for_the_generation_it_shares_weights_with():
    plan = plan_of("ppo", *ASYNC)
    assert plan.node("actor.update").after == ("rollout.generate",)
    assert plan.node("critic.update").after == ()


def test_a_trained_role_generating_itself_runs_its_generation_ahead(tmp_path):
    """`actor.generate` (no rollout role): the generation is on the rollout side, its
    update is refused uncorrected and, opted out, waits for the generation ahead."""
    path = write(tmp_path, TRAINED.format(name="self_generating", extra=""))
    plan = prepare(path, FAKE_BINDINGS + ASYNC, preflight=False).plan
    assert sides_of(plan).rollout == ("prompts", "actor.generate", "reward.score", "advantages")
    assert sides_of(plan).train == ("actor.logprob", "actor.update")
    assert plan.node("actor.update").after == ("actor.generate",)
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
    assert sides_of(plan).rollout == ("prompts", "rollout.generate", "reward.score")
    assert sides_of(plan).train[:2] == ("running_scale", "grpo_advantages")
