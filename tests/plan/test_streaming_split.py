"""The streaming split (plan/streaming_split.py, `trainer.async_mode=streaming`): the
stream side is the source and the one generate node, one streaming buffer hands whole
`uid` groups to everything else, and what cannot stream is refused before launch
naming the node or the keys."""
from __future__ import annotations

import os

import pytest

from hybridflow.core.constraints import ConfigError
from hybridflow.plan.async_split import buffer_nodes, buffer_summary, sides_of
from hybridflow.plan.compiler import GraphError
from hybridflow.plan.streaming_split import TOKEN_VERSIONS, is_streaming, stream_buffer
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
                   "actor.off_policy=decoupled")
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


def test_dapo_gather_is_refused_naming_it():
    with pytest.raises(GraphError, match=r"node 'gather'.*has no gather"):
        plan_of("dapo", *STREAM, *UNCORRECTED)


def test_a_generate_role_that_cannot_stream_is_refused():
    with pytest.raises(GraphError, match=r"agent.*(has no stream_submit|streams one generate)"):
        plan_of("agent_grpo", *STREAM, *UNCORRECTED)


@pytest.mark.parametrize("name", ["ppo", "rloo", "reinforce_pp"])
def test_the_other_single_generation_graphs_stream(name):
    plan = plan_of(name, *STREAM, *UNCORRECTED)
    assert sides_of(plan).rollout == ("prompts", "rollout.generate")
