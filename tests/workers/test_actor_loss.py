"""actor.update and actor.sft minimise the loss the graph passes: the loss's own
gradient moves the model (its sign decides the direction), its metrics come back
under actor/, the keys it declares reach it, and a malformed loss is a clear error."""
import pytest
import torch

from tests.support.workers import make_cfg, rollout_for_update
from hybridflow.core.batch import Batch
from hybridflow.graph.loss import loss_fn
from hybridflow.workers import ActorWorker


class EosLoss:
    """Pushes the probability of EOS at every response position up (sign=+1) or down."""

    def __init__(self, eos_id: int, sign: float):
        self.eos_id, self.sign = eos_id, sign
        loss_fn(reads=("teacher_weight",))(self)

    def __call__(self, micro, out):
        eos = torch.log_softmax(out.logits, -1)[..., self.eos_id] * micro["teacher_weight"]
        loss = -self.sign * out.mean(eos)
        return loss, {"eos_logp": out.mean(eos.detach())}


def _eos_logp(actor, data) -> float:
    out = EosLoss(actor.tokenizer.eos_token_id, 1.0)
    with torch.no_grad():
        from hybridflow.workers.loss_inputs import PolicyOutputs
        mask = data["response_mask"]
        inputs = PolicyOutputs(actor.module, data, mask.sum().double(), mask.shape[0])
        return float(out(data, inputs)[1]["eos_logp"])


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_update_follows_the_gradient_of_the_graphs_loss(sign):
    actor = ActorWorker(make_cfg(actor={"lr": 1e-2, "weight_decay": 0.0}))
    data = rollout_for_update(actor)
    data["teacher_weight"] = torch.ones(data["responses"].shape)
    before = _eos_logp(actor, data)
    loss = EosLoss(actor.tokenizer.eos_token_id, sign)
    metrics = [actor.update(data, loss=loss).meta["metrics"] for _ in range(3)]
    after = _eos_logp(actor, data)
    assert sign * (after - before) > 0.5  # moved the way the loss says, by a lot
    assert metrics[0]["actor/eos_logp"] == pytest.approx(before, abs=1e-4)
    assert "actor/pg_loss" not in metrics[0]  # the default loss did not run


def test_a_loss_missing_its_keys_names_them():
    actor = ActorWorker(make_cfg())
    data = rollout_for_update(actor)
    with pytest.raises(KeyError, match="teacher_weight"):
        actor.update(data, loss=EosLoss(actor.tokenizer.eos_token_id, 1.0))


def test_a_loss_returning_the_wrong_shape_of_result_is_named():
    actor = ActorWorker(make_cfg())

    @loss_fn()
    def bare(micro, out):
        return out.mean(out.log_probs)

    with pytest.raises(TypeError, match="'bare' must return"):
        actor.update(rollout_for_update(actor), loss=bare)


def test_sft_takes_a_loss_over_the_target_tokens():
    actor = ActorWorker(make_cfg(actor={"lr": 1e-2}))
    enc = actor.tokenizer(["1+2=3", "4+4=8"], padding=True, return_tensors="pt")
    mask = enc["attention_mask"]
    loss_mask = torch.zeros_like(mask)
    loss_mask[:, -1] = 1
    batch = Batch({"input_ids": enc["input_ids"], "attention_mask": mask,
                   "position_ids": (mask.cumsum(-1) - 1).clamp(min=0), "loss_mask": loss_mask})
    seen = []

    @loss_fn()
    def record(micro, out):
        seen.append((micro["responses"].clone(), micro["response_mask"].clone()))
        loss = -out.mean(out.log_probs)
        return loss, {"nll": loss}

    metrics = actor.sft(batch, loss=record).meta["metrics"]
    responses, target = seen[0]
    assert torch.equal(responses, enc["input_ids"][:, 1:])  # token t predicted from < t
    assert torch.equal(target, loss_mask[:, 1:])
    default = actor.sft(batch).meta["metrics"]
    assert default["actor/sft_loss"] < metrics["actor/nll"]  # same loss, one step later


def test_a_loss_reads_the_version_it_trains_instead_of_counting_its_calls():
    """out.policy_version: the actor updates applied before this one (one value for
    every micro-batch of an update, whatever the mini-batches and epochs)."""
    actor = ActorWorker(make_cfg(actor={"mini_batch_size": 2, "micro_batch_size": 1}))
    data = rollout_for_update(actor)
    seen = []

    @loss_fn()
    def scheduled(micro, out):
        seen.append(out.policy_version)
        coef = 1.0 / (1 + out.policy_version)  # a schedule over the trained version
        return -coef * out.mean(out.log_probs), {}

    for _ in range(3):
        actor.update(data, loss=scheduled, epochs=2)
    per_update = len(seen) // 3
    assert per_update > 1 and seen == [0] * per_update + [1] * per_update + [2] * per_update
    assert actor.policy_version == 3
