"""Training backends (hybridflow/workers/backends/) and mixed precision: backends are
chosen by name and a new one plugs in without touching the trainer; a module built in
bf16 trains float32 master weights with float32 AdamW state and computes in bf16,
and the actor's log-probs use the update's compute dtype."""
import pytest
import torch

from tests.support.workers import make_cfg, rollout_for_update
from hybridflow.workers import ActorWorker
from hybridflow.workers.backends import BACKENDS, make_backend
from hybridflow.workers.backends.ddp import DDPBackend
from hybridflow.workers.training import master_weights

CPU = torch.device("cpu")


def test_an_unknown_strategy_lists_the_registered_ones():
    with pytest.raises(ValueError, match="ddp, fsdp2"):
        make_backend("megatron", 1, CPU)


def test_a_registered_backend_is_what_the_trainer_uses(monkeypatch):
    calls = []

    class Recording(DDPBackend):
        name = "recording"

        def sync_context(self, model, last):
            calls.append(last)
            return super().sync_context(model, last)

    monkeypatch.setitem(BACKENDS, "recording", Recording)
    actor = ActorWorker(make_cfg(actor={"strategy": "recording", "mini_batch_size": 8,
                                        "micro_batch_size": 4}))
    assert isinstance(actor.trainer.backend, Recording)
    actor.update(rollout_for_update(actor))  # 8 rows: one mini-batch of two micro-batches
    assert calls == [False, True]


def test_master_weights_are_float32_and_frozen_weights_stay_low_precision():
    module = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 1)).bfloat16()
    module[0].requires_grad_(False)
    assert master_weights(module) == torch.bfloat16
    assert module[1].weight.dtype == torch.float32
    assert module[0].weight.dtype == torch.bfloat16
    assert master_weights(torch.nn.Linear(2, 2)) == torch.float32


def test_bf16_actor_trains_float32_master_weights_and_adam_state():
    actor = ActorWorker(make_cfg(model={"dtype": "bfloat16"},
                                 actor={"mini_batch_size": 8, "micro_batch_size": 8}))
    assert {p.dtype for p in actor.module.parameters()} == {torch.float32}
    assert actor.trainer.backend.compute_dtype == torch.bfloat16
    data = rollout_for_update(actor).take(slice(0, 8))
    metrics = actor.update(data).meta["metrics"]
    state = [t for s in actor.trainer.optimizer.state.values() for t in s.values()
             if t.dim() > 0]
    assert state and {t.dtype for t in state} == {torch.float32}
    # one epoch, one mini-batch: the update's forward matches actor.logprob's exactly,
    # so the first ratios are 1 (no clipping, no KL between old and new)
    assert metrics["actor/ppo_kl"] == 0.0 and metrics["actor/pg_clipfrac"] == 0.0


def test_bf16_log_probs_are_computed_in_bf16():
    fp32 = ActorWorker(make_cfg())
    bf16 = ActorWorker(make_cfg(model={"dtype": "bfloat16"}))
    data = rollout_for_update(fp32)
    low = bf16.logprob(data)["old_log_probs"]
    with torch.no_grad():  # the same (bf16-rounded) weights, computed in float32
        bf16.trainer.backend.compute_dtype = torch.float32
        high = bf16.logprob(data)["old_log_probs"]
    assert low.dtype == torch.float32 and not torch.equal(low, high)
    assert torch.allclose(low, high, atol=0.2)


def test_bf16_critic_trains_float32_master_weights():
    from hybridflow.workers import CriticWorker
    critic = CriticWorker(make_cfg(model={"dtype": "bfloat16"},
                                   critic={"mini_batch_size": 8, "micro_batch_size": 4}))
    assert {p.dtype for p in critic.module.parameters()} == {torch.float32}
    data = rollout_for_update(ActorWorker(make_cfg())).take(slice(0, 8))
    data = data.union(critic.values(data))
    data["returns"] = torch.ones_like(data["values"])
    before = critic.values(data)["values"]
    for _ in range(3):
        metrics = critic.update(data).meta["metrics"]
    after = critic.values(data)["values"]
    mask = data["response_mask"].bool()
    assert (after - 1).abs()[mask].mean() < (before - 1).abs()[mask].mean()  # fits returns
    assert "critic/vf_loss" in metrics
