"""CriticWorker fits a constant return; ReferenceWorker is the frozen initial policy."""
import pytest
import torch

from tests.support.workers import empty_like, make_cfg, rollout_for_update
from hybridflow.workers import ActorWorker, CriticWorker, ReferenceWorker
from hybridflow.workers.base import held_bytes


def test_critic_fits_a_constant_return():
    cfg = make_cfg(critic={"lr": 3e-3, "mini_batch_size": 8, "micro_batch_size": 4,
                           "cliprange_value": 0.5})
    critic = CriticWorker(cfg)
    data = rollout_for_update(ActorWorker(cfg)).drop("values")
    mask = data["response_mask"].float()
    data["returns"] = 0.7 * mask
    for _ in range(60):
        step = data.union(critic.values(data))
        metrics = critic.update(step).meta["metrics"]
    values = critic.values(data)["values"]
    error = ((values - 0.7).abs() * mask).sum() / mask.sum()
    assert error < 0.05, error
    assert {"critic/vf_loss", "critic/vf_clipfrac", "critic/values/mean"} <= set(metrics)
    assert metrics["critic/values/mean"] == pytest.approx(0.7, abs=0.1)
    assert values.shape == data["responses"].shape
    assert (values[mask == 0] == 0).all()
    assert critic.values(empty_like(data))["values"].shape == (0, 6)


def test_reference_is_the_frozen_initial_policy():
    cfg = make_cfg(actor={"lr": 0.05})
    actor, ref = ActorWorker(cfg), ReferenceWorker(cfg)
    data = rollout_for_update(actor)
    assert torch.equal(ref.logprob(data)["ref_log_prob"], data["old_log_probs"])
    actor.update(data)
    assert torch.equal(ref.logprob(data)["ref_log_prob"], data["old_log_probs"])
    assert not torch.allclose(actor.logprob(data)["old_log_probs"], data["old_log_probs"])
    assert not any(p.requires_grad for p in ref.module.parameters())
    assert held_bytes([ref.held_tensors()])["engine/weight_bytes"] > 0


def test_inference_roles_need_no_process_group_on_a_simulated_rank():
    from hybridflow.workers import RewardWorker, WorkerContext
    ctx = WorkerContext(rank=1, world_size=2, device="cpu")
    cfg = make_cfg()
    data = rollout_for_update(ActorWorker(cfg))
    assert ReferenceWorker(cfg, ctx).logprob(data)["ref_log_prob"].shape == (8, 6)
    assert RewardWorker(cfg, ctx).score(data)["scores"].shape == (8,)
    assert not torch.distributed.is_initialized()
