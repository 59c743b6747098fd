"""One step of the toy GRPO and PPO graphs with the compiler's removal of actor.logprob
(one optimizer step per batch) and without it (trainer.keep_unneeded_passes=true):
equal losses and equal updated weights."""
import pytest

from hybridflow.program.assemble import prepare
from hybridflow.run.loop import Trainer
from hybridflow.run.tracking import new_run_dir
from tests.support.e2e import graph_file

ONE_STEP = ("trainer.steps=1", "trainer.val_every=0", "trainer.progress=false",
            "data.batch_size=8", "rollout.n=4", "actor.mini_batch_size=32",
            "actor.micro_batch_size=16", "critic.mini_batch_size=32")


def one_step(tmp_path, name: str, keep: bool, *extra: str):
    """(the plan's node names, the step's metrics, the actor's weights after it)."""
    folder = tmp_path / f"{name}_{keep}"
    loaded = prepare(graph_file(name), [f"trainer.runs_dir={folder}", *ONE_STEP,
                                        f"trainer.keep_unneeded_passes={keep}", *extra])
    run = new_run_dir(str(folder), loaded.graph.name)
    run.save_config(loaded.cfg)
    trainer = Trainer(loaded, run)
    try:
        trainer.fit()
        module = trainer.runtime.workers("actor")[0].module
        weights = {k: v.detach().clone() for k, v in module.named_parameters()}
    finally:
        trainer.close()
    return [n.name for n in loaded.plan.nodes], run.read_metrics()[-1], weights


@pytest.mark.slow  # four one-step runs (~15 s)
@pytest.mark.parametrize("name,extra", [("grpo", ()),
                                        ("ppo", ("algorithm.kl_in_reward=false",))])
def test_the_update_without_the_old_log_probs_node_trains_the_same(tmp_path, name, extra):
    nodes, removed, weights = one_step(tmp_path, name, False, *extra)
    kept_nodes, kept, kept_weights = one_step(tmp_path, name, True, *extra)
    assert "actor.logprob" not in nodes and "actor.logprob" in kept_nodes
    assert "timing_s/actor.logprob" in kept and "timing_s/actor.logprob" not in removed
    losses = [k for k in kept if k.startswith(("actor/pg_", "actor/kl_", "actor/ppo_kl",
                                              "actor/grad_norm", "critic/vf_loss"))]
    assert "actor/pg_loss" in losses
    for key in losses:
        assert removed[key] == pytest.approx(kept[key], abs=1e-6), key
    assert max((weights[k] - kept_weights[k]).abs().max().item() for k in weights) <= 1e-6


@pytest.mark.slow  # two one-step runs (~8 s)
def test_old_log_probs_from_the_hf_engine_agree_with_the_recomputed_ones(tmp_path):
    """actor.old_log_probs=rollout: the HF engine samples with the trained module, so
    its log-probs stand in for the recomputed ones (fp32: the ratio is 1 to ~1e-6)."""
    nodes, from_engine, weights = one_step(tmp_path, "grpo", False,
                                           "actor.old_log_probs=rollout")
    _, recomputed, recomputed_weights = one_step(tmp_path, "grpo", True)
    assert "actor.logprob" not in nodes
    assert abs(from_engine["actor/ppo_kl"]) < 1e-5 and from_engine["actor/pg_clipfrac"] == 0
    assert from_engine["actor/pg_loss"] == pytest.approx(recomputed["actor/pg_loss"], abs=1e-5)
    assert max((weights[k] - recomputed_weights[k]).abs().max().item() for k in weights) < 1e-4
