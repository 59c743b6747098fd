"""The compiler removes the old log-probs' node when the update makes one optimizer step
per batch (plan/unneeded.py), keeps it otherwise, and says which and why in the plan's
summary (`hybridflow check`) and the drawing."""
import pytest

from hybridflow.draw.graph import plan_to_dot
from hybridflow.plan.unneeded import rows_bound
from hybridflow.program.assemble import prepare
from tests.support.e2e import graph_file

ONE_STEP = ("data.batch_size=8", "rollout.n=4", "actor.mini_batch_size=32")


def plan_of(name, *overrides):
    return prepare(graph_file(name), list(overrides), preflight=False).plan


def names(plan):
    return [n.name for n in plan.nodes]


@pytest.mark.parametrize("name,extra", [("grpo", ()), ("ppo", ("algorithm.kl_in_reward=false",)),
                                        ("dapo", ())])
def test_one_step_per_batch_removes_the_old_log_probs_node(name, extra):
    plan = plan_of(name, *ONE_STEP, *extra)
    assert "actor.logprob" not in names(plan)
    update = plan.node("actor.update")
    assert update.kwargs["from_current"] == ("old_log_probs",)
    assert "old_log_probs" not in update.reads and "actor.logprob" not in update.deps
    [record] = plan.unneeded
    assert record.removed and record.node.name == "actor.logprob"
    assert "one optimizer step per batch (at most 32 rows)" in record.reason
    summary = plan.summary()
    assert "removed: 'actor.logprob'" in summary and "trainer.keep_unneeded_passes=true" in summary
    assert all("actor.logprob" not in stage for stage in plan.stages)


def test_the_option_keeps_every_node_and_says_nothing():
    plan = plan_of("grpo", *ONE_STEP, "trainer.keep_unneeded_passes=true")
    assert "actor.logprob" in names(plan)
    assert "from_current" not in plan.node("actor.update").kwargs
    assert not plan.unneeded and "removed:" not in plan.summary()


@pytest.mark.parametrize("overrides,why", [
    (("actor.ppo_epochs=2",), "makes 2 optimizer steps per batch of at most 32 rows"),
    (("actor.mini_batch_size=16",), "makes 2 optimizer steps per batch of at most 32 rows"),
    (("rollout.n=8", "actor.mini_batch_size=32"), "at most 64 rows"),
])
def test_more_than_one_optimizer_step_keeps_the_node_and_says_why(overrides, why):
    plan = plan_of("grpo", *ONE_STEP, *overrides)
    assert "actor.logprob" in names(plan)
    assert "from_current" not in plan.node("actor.update").kwargs
    [record] = plan.unneeded
    assert not record.removed and why in record.reason
    assert "kept: 'actor.logprob'" in plan.summary()


def test_old_log_probs_that_feed_the_reward_s_kl_keep_the_node():
    plan = plan_of("ppo", *ONE_STEP)  # kl_in_reward: the KL penalty reads old_log_probs
    assert "actor.logprob" in names(plan)
    [record] = plan.unneeded
    assert not record.removed and "also feed 'kl_in_reward'" in record.reason


def test_a_metric_node_reading_the_old_log_probs_keeps_it(tmp_path):
    path = tmp_path / "metric_graph.py"
    path.write_text(
        "from hybridflow import Graph, node_fn\n"
        "from hybridflow.core.batch import Batch\n"
        "from graphs import ops\n"
        "from graphs.grpo import defaults\n\n"
        "@node_fn(reads=('old_log_probs',))\n"
        "def old_mean(batch):\n"
        "    out = Batch()\n"
        "    out.meta['metrics'] = {'old/mean': float(batch['old_log_probs'].mean())}\n"
        "    return out\n\n"
        "def build(cfg):\n"
        "    g = Graph('metric')\n"
        "    rollout = g.call('rollout.generate', g.source('prompts'), n=cfg.rollout.n)\n"
        "    old = g.call('actor.logprob', rollout)\n"
        "    g.fn(old_mean, old)\n"
        "    adv = g.fn(ops.grpo_advantages, rollout, g.call('reward.score', rollout))\n"
        "    g.call('actor.update', rollout, old, adv, g.call('ref.logprob', rollout),\n"
        "           loss=ops.policy_loss(cfg.actor))\n"
        "    return g\n")
    plan = prepare(str(path), list(ONE_STEP), preflight=False).plan
    assert "actor.logprob" in names(plan)
    assert "also feed 'old_mean'" in plan.unneeded[0].reason


def test_a_log_prob_node_called_with_arguments_is_kept(tmp_path):
    path = tmp_path / "entropy_graph.py"
    path.write_text(
        "from hybridflow import Graph\n"
        "from graphs import ops\n"
        "from graphs.grpo import defaults\n\n"
        "def build(cfg):\n"
        "    g = Graph('entropy')\n"
        "    rollout = g.call('rollout.generate', g.source('prompts'), n=cfg.rollout.n)\n"
        "    old = g.call('actor.logprob', rollout, with_entropy=True)\n"
        "    adv = g.fn(ops.grpo_advantages, rollout, g.call('reward.score', rollout))\n"
        "    g.call('actor.update', rollout, old, adv, g.call('ref.logprob', rollout),\n"
        "           loss=ops.policy_loss(cfg.actor))\n"
        "    return g\n")
    plan = prepare(str(path), list(ONE_STEP), preflight=False).plan
    assert "actor.logprob" in names(plan)
    assert "called with arguments (with_entropy)" in plan.unneeded[0].reason


def test_rows_bound_follows_sources_repeats_and_gathers():
    plan = plan_of("dapo", "trainer.keep_unneeded_passes=true", *ONE_STEP)
    n = lambda node: 4  # noqa: E731
    assert rows_bound(plan, "rollout.generate", 8, n) == 8
    assert rows_bound(plan, "reward.score", 8, n) == 32
    assert rows_bound(plan, "actor.update", 8, n) == 32  # the gather's until


def test_the_drawing_shows_the_removed_node_dashed_with_its_reason():
    source = plan_to_dot(plan_of("grpo", *ONE_STEP)).source
    assert "actor.logprob" in source and "removed" in source
    line = next(ln for ln in source.splitlines() if ln.strip().startswith('"actor.logprob" ['))
    assert "dashed" in line and "one optimizer step" in line
    kept = plan_to_dot(plan_of("grpo", *ONE_STEP, "actor.ppo_epochs=2")).source
    assert "removed" not in kept


def test_old_log_probs_from_the_rollout_remove_the_node_whatever_the_steps():
    plan = plan_of("grpo", "actor.old_log_probs=rollout")  # the toy's 2 mini-batches
    assert "actor.logprob" not in names(plan)
    update = plan.node("actor.update")
    assert "rollout_log_probs" in update.reads and "old_log_probs" not in update.reads
    assert "from_current" not in update.kwargs
    [record] = plan.unneeded
    assert record.removed and "takes old_log_probs from rollout_log_probs" in record.reason
    kept = plan_of("ppo", "actor.old_log_probs=rollout")  # the reward's KL still reads it
    assert "actor.logprob" in names(kept) and not kept.unneeded[0].removed


def test_a_source_column_no_input_provides_is_refused_before_launch():
    from hybridflow.plan.compiler import GraphError
    from hybridflow.plan.unneeded import drop_unneeded
    plan = plan_of("grpo", "trainer.keep_unneeded_passes=true")
    with pytest.raises(GraphError, match=r"node 'actor.update'.*takes old_log_probs from "
                                         r"engine_log_probs.*none of its inputs provides"):
        drop_unneeded(plan, lambda node: (1, 8), lambda node: {"old_log_probs":
                                                               "engine_log_probs"})
