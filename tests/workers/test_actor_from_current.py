"""actor.update(from_current=("old_log_probs",)): the loss's old log-probs are the
detached log-probs of the update's own forward (plan/unneeded.py removed the node that
computed them); equal to the log-prob node's at the only optimizer step, and more than
one step is refused."""
import pytest
import torch

from hybridflow.core.batch import Batch
from hybridflow.workers import ActorWorker
from hybridflow.workers.loss_inputs import with_current
from tests.support.workers import make_cfg, rollout_for_update


def trained(batch, old_log_probs="recompute", **update):
    actor = ActorWorker(make_cfg(actor={"mini_batch_size": 8, "micro_batch_size": 4,
                                        "use_kl_loss": True, "old_log_probs": old_log_probs}))
    metrics = actor.update(batch, **update).meta["metrics"]
    return metrics, {k: v.detach().clone() for k, v in actor.module.named_parameters()}


def test_one_step_from_the_current_forward_equals_one_from_the_log_prob_node():
    batch = rollout_for_update(ActorWorker(make_cfg()))  # 8 rows, old_log_probs computed
    assert len(batch) == 8
    with_node, weights = trained(batch)
    without, weights_own = trained(batch.select(*[k for k in batch.keys()
                                                 if k != "old_log_probs"]),
                                   from_current=("old_log_probs",))
    for key in ("actor/pg_loss", "actor/kl_loss", "actor/grad_norm", "actor/ppo_kl"):
        assert without[key] == pytest.approx(with_node[key], abs=1e-6), key
    assert without["actor/pg_clipfrac"] == 0.0  # the ratio is 1 at the only step
    assert max((weights[k] - weights_own[k]).abs().max().item() for k in weights) <= 1e-6


def test_more_than_one_optimizer_step_is_refused_naming_the_option():
    batch = rollout_for_update(ActorWorker(make_cfg())).drop("old_log_probs")
    actor = ActorWorker(make_cfg(actor={"mini_batch_size": 4, "micro_batch_size": 4}))
    with pytest.raises(ValueError, match=r"1 epoch\(s\) x 2 mini-batch.*"
                                         r"trainer.keep_unneeded_passes=true"):
        actor.update(batch, from_current=("old_log_probs",))
    with pytest.raises(ValueError, match=r"2 epoch\(s\) x 1 mini-batch"):
        ActorWorker(make_cfg()).update(batch, epochs=2, from_current=("old_log_probs",))


def test_only_declared_keys_can_come_from_the_forward():
    batch = rollout_for_update(ActorWorker(make_cfg()))
    with pytest.raises(ValueError, match=r"only \['old_log_probs'\].*\['ref_log_prob'\]"):
        ActorWorker(make_cfg()).update(batch, from_current=("ref_log_prob",))


def test_with_current_fills_a_copy_with_the_detached_output():
    class Out:
        log_probs = torch.ones(2, 3, requires_grad=True) * 2

    micro = Batch({"responses": torch.zeros(2, 3)})
    filled = with_current(micro, Out(), {"old_log_probs": "log_probs"})
    assert "old_log_probs" not in micro  # the caller's micro-batch is not changed
    assert torch.equal(filled["old_log_probs"], torch.full((2, 3), 2.0))
    assert not filled["old_log_probs"].requires_grad


def test_old_log_probs_from_the_rollout_are_the_engine_s_log_probs():
    batch = rollout_for_update(ActorWorker(make_cfg()))
    explicit = batch.select(*batch.keys())
    explicit["old_log_probs"] = batch["rollout_log_probs"]
    want, weights = trained(explicit)
    got, weights_rollout = trained(batch.drop("old_log_probs"), old_log_probs="rollout")
    assert got["actor/pg_loss"] == want["actor/pg_loss"]
    assert all(torch.equal(weights[k], weights_rollout[k]) for k in weights)


def test_old_log_probs_from_the_rollout_need_the_engine_s_column():
    batch = rollout_for_update(ActorWorker(make_cfg())).drop("rollout_log_probs")
    actor = ActorWorker(make_cfg(actor={"old_log_probs": "rollout"}))
    with pytest.raises(KeyError, match="actor.old_log_probs=rollout.*rollout_log_probs"):
        actor.update(batch)
