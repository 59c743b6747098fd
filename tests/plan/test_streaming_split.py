"""The streaming split (plan/streaming_split.py, `trainer.async_mode=streaming`): the
stream side is the source, the one generate node and (trainer.stream_side=auto) the
nodes that can run on whole groups on the rollout's pool; a streaming buffer per
handed-over node hands whole `uid` groups to everything else (with a gather, DAPO's
filter screens each group at the buffer's entrance), and what cannot stream is
refused before launch naming the node or the keys."""
from __future__ import annotations

import os

import pytest

from hybridflow.core.columns import STREAM_COLUMNS
from hybridflow.core.constraints import ConfigError
from hybridflow.plan.async_split import buffer_nodes, buffer_summary, sides_of
from hybridflow.plan.compiler import GraphError
from hybridflow.plan.stream_filter import entrance_names, entrance_plan, groups_per_step
from hybridflow.plan.streaming_split import (TOKEN_VERSIONS, is_streaming, joint_plan,
                                             stream_buffer, stream_buffers)
from hybridflow.program.assemble import prepare

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STREAM = ["trainer.staleness=1", "trainer.async_mode=streaming"]
UNCORRECTED = ["trainer.allow_uncorrected_async=true"]


def plan_of(name: str, *overrides: str):
    return prepare(os.path.join(REPO, "graphs", f"{name}.py"), list(overrides),
                   preflight=False).plan


@pytest.mark.parametrize("k", [1, 2])
def test_grpo_streams_its_generation_into_one_buffer(k):
    plan = plan_of("grpo", f"trainer.staleness={k}", "trainer.async_mode=streaming",
                   "actor.off_policy=decoupled", "trainer.stream_side=generate_only")
    sides = sides_of(plan)
    assert sides.rollout == ("prompts", "rollout.generate")
    assert set(sides.train) == {"actor.logprob", "reward.score", "grpo_advantages",
                                "ref.logprob", "actor.update"}
    (buffer,) = buffer_nodes(plan)
    assert buffer is stream_buffer(plan) and is_streaming(plan)
    spec = buffer.buffer
    assert (spec.producer, spec.capacity, spec.unit, spec.max_staleness, spec.streaming) == \
        ("rollout.generate", k, "uid", k, True)
    assert TOKEN_VERSIONS in buffer.output_keys
    assert "trainer.async_mode=streaming" in buffer_summary(plan)
    assert "streams samples as they finish" in buffer_summary(plan)


@pytest.mark.parametrize("k", [1, 2])
def test_grpo_runs_its_reward_reference_and_advantages_on_the_stream_side(k):
    """The default (trainer.stream_side=auto): the rule reward, the reference (its
    role on the rollout's pool) and the group advantages (grouped by uid) join the
    stream side; the train side reads the samples and each handed-over node through
    a streaming buffer of its own."""
    plan = plan_of("grpo", f"trainer.staleness={k}", "trainer.async_mode=streaming",
                   "actor.off_policy=decoupled")
    sides = sides_of(plan)
    assert sides.rollout == ("prompts", "rollout.generate", "reward.score",
                             "grpo_advantages", "ref.logprob")
    assert sides.train == ("actor.logprob", "actor.update")
    assert [b.name for b in stream_buffers(plan)] == [
        "buffer/rollout.generate", "buffer/grpo_advantages", "buffer/ref.logprob"]
    assert stream_buffer(plan).name == "buffer/rollout.generate"
    assert all(b.buffer.capacity == k for b in stream_buffers(plan))
    update = plan.node("actor.update")
    assert set(update.deps) == {"buffer/rollout.generate", "actor.logprob",
                                "buffer/grpo_advantages", "buffer/ref.logprob"}
    assert "buffer/grpo_advantages -> actor.update" in buffer_summary(plan)


def test_a_node_off_the_rollouts_pool_stays_on_the_train_side_and_what_reads_it():
    """The rollout on a pool of its own: the reward and the reference run on the main
    pool, so they stay on the train side, and so do the advantages, which read the
    reward; the reference on the rollout's pool moves alone."""
    split = ("placement.pools.gen.devices_per_node=1", "placement.roles.rollout=gen")
    plan = plan_of("grpo", *STREAM, "actor.off_policy=decoupled", *split)
    assert sides_of(plan).rollout == ("prompts", "rollout.generate")
    plan = plan_of("grpo", *STREAM, "actor.off_policy=decoupled", *split,
                   "placement.roles.ref=gen")
    assert sides_of(plan).rollout == ("prompts", "rollout.generate", "ref.logprob")


def test_a_batch_level_function_stays_on_the_train_side():
    """reinforce_pp's advantages whiten over the batch (not grouped, not row-wise):
    they need the step's whole batch, which the stream side never has."""
    plan = plan_of("reinforce_pp", *STREAM, *UNCORRECTED)
    sides = sides_of(plan)
    assert "reinforce_pp_advantages" in sides.train
    assert {"reward.score", "ref.logprob"} <= set(sides.rollout)


def test_a_bad_stream_side_is_refused_naming_the_key():
    with pytest.raises(ConfigError, match=r"trainer.stream_side"):
        plan_of("grpo", *STREAM, "actor.off_policy=decoupled", "trainer.stream_side=all")


def test_the_pipelined_mode_is_the_default_and_not_streaming():
    plan = plan_of("grpo", "trainer.staleness=1", *UNCORRECTED)
    assert not is_streaming(plan) and len(buffer_nodes(plan)) == 3


def test_streaming_refuses_an_uncorrected_update():
    with pytest.raises(GraphError, match=r"node 'actor.update'.*no off-policy correction.*"
                                         r"actor.off_policy=tis"):
        plan_of("grpo", *STREAM)


def test_streaming_with_staleness_zero_is_refused_naming_the_keys():
    with pytest.raises(ConfigError, match=r"trainer.async_mode=streaming needs "
                                          r"trainer.staleness >= 1.*trainer.staleness=0"):
        plan_of("grpo", "trainer.async_mode=streaming", *UNCORRECTED)


def test_an_unknown_mode_is_refused_naming_the_valid_ones():
    with pytest.raises(ConfigError, match=r"trainer.async_mode='stream'.*did you mean "
                                          r"'streaming'.*pipeline, streaming"):
        plan_of("grpo", "trainer.staleness=1", "trainer.async_mode=stream", *UNCORRECTED)


def test_two_generate_nodes_are_refused():
    with pytest.raises(GraphError, match=r"streams one generate node, but graph 'remax' "
                                         r"has 2.*trainer.async_mode=pipeline"):
        plan_of("remax", *STREAM, *UNCORRECTED)


def test_dapo_streams_with_its_filter_at_the_buffer_entrance():
    plan = plan_of("dapo", *STREAM, "actor.off_policy=decoupled")
    sides = sides_of(plan)
    assert sides.rollout == ("prompts", "rollout.generate", "reward.score",
                             "overlong_penalty", "drop_uniform_groups", "gather")
    assert sides.train == ("actor.logprob", "grpo_advantages", "actor.update")
    buffer = stream_buffer(plan)
    spec = buffer.buffer
    assert (buffer.name, spec.producer, spec.unit, spec.screened_by) == \
        ("buffer/gather", "gather", "uid", "drop_uniform_groups")
    assert "screened at the entrance by 'drop_uniform_groups'" in buffer_summary(plan)
    gen, gather = plan.node("rollout.generate"), plan.node("gather")
    assert entrance_names(plan, gen, gather) == ["reward.score", "overlong_penalty",
                                                 "drop_uniform_groups"]
    assert groups_per_step(gen, gather) == 16  # data.batch_size: until = 16 * n rows
    # the entrance pass: the generate node's rows fed through a buffer of their own,
    # token_versions carried through the forwarding filter to the buffer's rows
    entrance = entrance_plan(plan, gen, gather, 1)
    assert [n.name for n in entrance.nodes] == [
        "prompts", "rollout.generate", "buffer/rollout.generate", "reward.score",
        "overlong_penalty", "drop_uniform_groups"]
    assert entrance.node("reward.score").deps == ("buffer/rollout.generate",)
    assert TOKEN_VERSIONS in entrance.node("drop_uniform_groups").output_keys
    assert set(buffer.output_keys) <= set(entrance.node("drop_uniform_groups").output_keys)


def _dapo_variant(tmp_path, old: str, new: str) -> str:
    text = open(os.path.join(REPO, "graphs", "dapo.py")).read()
    assert old in text
    path = tmp_path / "dapo_variant.py"
    path.write_text(text.replace(old, new))
    return str(path)


@pytest.mark.parametrize("old,new,refusal", [
    ("old = g.call(\"actor.logprob\", batch)", "old = g.call(\"actor.logprob\", rollout)",
     r"node 'actor.logprob'.*hands over the gather's rows only.*reads \['rollout.generate'\]"),
    ("until=cfg.data.batch_size * cfg.rollout.n,", "until=cfg.data.batch_size * cfg.rollout.n + 1,",
     r"node 'gather'.*until/n whole groups.*until=65.*n=4"),
    ("batch = g.gather(kept,", "kept = g.gather(kept, until=4, max_rounds=1, name=\"first\")\n"
     "    batch = g.gather(kept,",
     r"filters at one buffer's entrance, but the graph has 2 gathers"),
])
def test_a_gather_that_cannot_filter_at_the_entrance_is_refused(tmp_path, old, new, refusal):
    graph = _dapo_variant(tmp_path, old, new)
    with pytest.raises(GraphError, match=refusal):
        prepare(graph, [*STREAM, *UNCORRECTED, "rollout.n=4"], preflight=False)


def test_a_generate_role_that_cannot_stream_is_refused(tmp_path):
    text = open(os.path.join(REPO, "graphs", "grpo.py")).read()
    old = 'g.call("rollout.generate", prompts'
    assert old in text
    graph = tmp_path / "grpo_actor_generates.py"
    graph.write_text(text.replace(old, 'g.call("actor.generate", prompts'))
    with pytest.raises(GraphError, match=r"node 'actor.generate'.*needs a generate call "
                                         r"of a role that streams.*role 'actor' "
                                         r"\(ActorWorker\) declares no streaming \(STREAMS"):
        prepare(str(graph), [*STREAM, *UNCORRECTED], preflight=False)


NO_VERSIONS = '''
from hybridflow.core.columns import TOKEN_VERSIONS
from hybridflow.graph.dispatch import method
from hybridflow.workers.rollout.generation import GENERATE_WRITES
from hybridflow.workers.rollout.worker import RolloutWorker


class NoVersions(RolloutWorker):
    @method(reads=("input_ids", "attention_mask"), kind="generate", forwards=True,
            writes=tuple(k for k in GENERATE_WRITES if k != TOKEN_VERSIONS),
            overwrites=("input_ids", "attention_mask", "position_ids"))
    def generate(self, batch, n=None):
        raise NotImplementedError  # compiled, never run


class Misdeclared(RolloutWorker):
    STREAMS = True
'''


def test_a_streaming_role_whose_generate_writes_no_versions_is_refused(tmp_path):
    """The stream's columns are the generate method's own declaration, not patched in."""
    roles = tmp_path / "roles.py"
    roles.write_text(NO_VERSIONS)
    with pytest.raises(GraphError, match=r"node 'rollout.generate'.*role 'rollout' "
                                         r"\(NoVersions\) streams, but its 'generate' method "
                                         r"does not write \['token_versions'\]"):
        plan_of("grpo", *STREAM, *UNCORRECTED, f"workers.rollout={roles}:NoVersions")
    with pytest.raises(GraphError, match=r"node 'rollout.generate'.*Misdeclared.STREAMS must "
                                         r"be a hybridflow.graph.streams.Streams.*not True"):
        plan_of("grpo", *STREAM, *UNCORRECTED, f"workers.rollout={roles}:Misdeclared")


def test_the_streaming_buffer_carries_the_columns_the_generate_method_declares():
    plan = plan_of("grpo", *STREAM, "actor.off_policy=decoupled")
    gen, buffer = plan.node("rollout.generate"), stream_buffer(plan)
    assert set(STREAM_COLUMNS) <= set(gen.writes)
    assert {k: buffer.output_keys[k] for k in STREAM_COLUMNS} == \
        {k: "rollout.generate" for k in STREAM_COLUMNS}


def test_agent_episodes_stream_into_one_buffer(monkeypatch):
    plan = plan_of("agent_grpo", *STREAM, "actor.off_policy=decoupled")
    assert sides_of(plan).rollout == ("prompts", "agent.play", "grpo_advantages")
    assert stream_buffer(plan).name == "buffer/agent.play"
    # whole episodes stream on the engine's plain generate: any engine will do
    from hybridflow.workers.rollout import engine
    from hybridflow.workers.rollout.hf import make_hf_engine
    monkeypatch.setattr(engine, "_ENGINES", dict(engine._ENGINES))
    engine.register_engine("batch_only_agent_test", make_hf_engine)
    plan = plan_of("agent_grpo", *STREAM, "actor.off_policy=decoupled",
                   "rollout.backend=batch_only_agent_test")
    assert stream_buffer(plan).name == "buffer/agent.play"


@pytest.mark.parametrize("name", ["ppo", "rloo", "reinforce_pp"])
def test_the_other_single_generation_graphs_stream(name):
    plan = plan_of(name, *STREAM, *UNCORRECTED, "trainer.stream_side=generate_only")
    assert sides_of(plan).rollout == ("prompts", "rollout.generate")


@pytest.mark.parametrize("name", ["grpo", "dapo"])
def test_a_steps_pass_holds_the_entrance_after_the_train_sides_takes_sharing_no_edge(name):
    """joint_plan: the plan's nodes and the entrance's feed and nodes under names
    prefixed `entrance/`, reading only each other (and the skipped sources); the pass
    skips the stream side, so the train side and the entrance run side by side. In
    submission order the train side's buffers (their takes) come first, then the
    entrance, then the rest of the train side (so on the rollout's worker the
    entrance is not queued behind the weight sync)."""
    plan = plan_of(name, "trainer.staleness=2", "trainer.async_mode=streaming",
                   "actor.off_policy=decoupled")
    side = frozenset(sides_of(plan).rollout)
    gen = plan.node("rollout.generate")
    gather = plan.node("gather") if name == "dapo" else None
    names = None if gather else [n.name for n in plan.nodes if n.name in side
                                 and n.name not in ("prompts", gen.name)]
    entrance = entrance_plan(plan, gen, gather, 2, names)
    joint, skip = joint_plan(plan, entrance, side)
    assert skip == side
    inside = [n for n in joint.nodes if n.name.startswith("entrance/")]
    assert inside[0].name == "entrance/buffer/rollout.generate"
    assert [n.name for n in inside[1:]] == [f"entrance/{n.name}" for n in entrance.nodes[3:]]
    assert {n.name for n in joint.nodes} - {n.name for n in inside} == \
        {n.name for n in plan.nodes}
    ran = [n.name for n in joint.nodes if n.name not in skip]
    buffers = [b.name for b in stream_buffers(plan)]
    first = ran.index(inside[0].name)
    assert sorted(ran[:first]) == sorted(buffers)
    assert ran.index("weight_sync" if "weight_sync" in ran else "actor.update") > \
        ran.index(inside[-1].name)
    own = {n.name for n in inside}
    for node in inside[1:]:
        assert set(node.deps) <= own | {"prompts"}, node
        assert node.output_keys == entrance.node(node.name[len("entrance/"):]).output_keys
    assert not any(d in own for n in joint.nodes if n.name not in own for d in n.deps)
