"""The compile-time refusal of an uncorrected async update: it names the update node
and the key to set, and lets a correction (graph loss or config default) or the
explicit opt-out through."""
import pytest

from hybridflow.plan.async_split import sides_of
from hybridflow.plan.compiler import GraphError
from hybridflow.program.assemble import prepare
from tests.support.e2e import graph_file

DEFAULT_LOSS_GRAPH = '''
from hybridflow import Graph
from graphs import ops
from graphs.common import embedded_defaults


def defaults():
    return embedded_defaults(rollout={"n": 4})


def build(cfg):
    g = Graph("default_loss")
    rollout = g.call("rollout.generate", g.source("prompts"), n=cfg.rollout.n)
    old = g.call("actor.logprob", rollout)
    adv = g.fn(ops.grpo_advantages, rollout, g.call("reward.score", rollout))
    g.call("actor.update", rollout, old, adv)  # no loss=: the config's default loss
    return g
'''


def test_an_uncorrected_async_update_is_refused_naming_node_and_key():
    with pytest.raises(GraphError) as err:
        prepare(graph_file("grpo"), ["trainer.staleness=1"], preflight=False)
    message = str(err.value)
    assert "node 'actor.update'" in message and "grpo.py" in message
    assert "actor.off_policy=tis" in message and "trainer.allow_uncorrected_async" in message


@pytest.mark.parametrize("extra", [("actor.off_policy=tis",), ("actor.off_policy=decoupled",),
                                   ("trainer.allow_uncorrected_async=true",)])
def test_a_correction_or_the_opt_out_compiles(extra):
    plan = prepare(graph_file("grpo"), ["trainer.staleness=2", *extra], preflight=False).plan
    assert sides_of(plan).staleness == 2


def test_the_default_loss_counts_as_corrected_when_its_config_corrects(tmp_path):
    path = tmp_path / "default_loss.py"
    path.write_text(DEFAULT_LOSS_GRAPH)
    with pytest.raises(GraphError, match="node 'actor.update'"):
        prepare(str(path), ["trainer.staleness=1"], preflight=False)
    plan = prepare(str(path), ["trainer.staleness=1", "actor.off_policy=tis"],
                   preflight=False).plan
    assert "rollout_log_probs" in plan.node("actor.update").optional


def test_synchronous_training_needs_no_correction():
    plan = prepare(graph_file("grpo"), [], preflight=False).plan
    assert sides_of(plan) is None
