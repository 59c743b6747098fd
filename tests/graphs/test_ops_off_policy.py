"""graphs/ops.py PolicyLoss with an off-policy correction: it declares
`rollout_log_probs` only when corrected, weighs the surrogate's tokens by the
behaviour weights (hand-computed here), reports them under off_policy/ as shares that
sum over micro-batches, shows the correction in its repr, is unchanged without one,
and the config refuses a correction it does not know, naming the key."""
from __future__ import annotations

import math

import pytest
import torch

from algorithms.losses import behaviour_weights, ppo_policy_loss
from graphs import ops
from hybridflow import Batch
from hybridflow.program.config import build_config
from hybridflow.core.constraints import ConfigError
from hybridflow.graph.loss import loss_spec
from hybridflow.workers.config import ActorConfig
from hybridflow.workers.loss_inputs import LossInputs

MASK = torch.tensor([[1, 1, 1], [1, 1, 0]])
OLD = torch.tensor([[-1.0, -0.5, -1.2], [-0.3, -1.0, -1.0]])
ROLLOUT = torch.tensor([[-2.0, -0.5, -0.7], [-0.6, -0.8, -6.0]])  # log w: 1, 0, -.5 | .3, -.2
ADV = torch.tensor([[1.0, -1.0, 2.0], [0.5, 1.0, 9.0]])
e = math.exp


class Outputs(LossInputs):
    """What actor.update hands the loss, with given log-probs instead of a model's."""

    def __init__(self, micro: Batch, log_probs: torch.Tensor, tokens=None):
        mask = micro["response_mask"]
        tokens = mask.sum().double() if tokens is None else tokens
        super().__init__(None, micro, tokens, (mask.sum(-1) > 0).sum().double(), "response_mask")
        self.log_probs = log_probs

    def entropy(self, grad: bool = True) -> torch.Tensor:
        return torch.zeros_like(self.log_probs)


def micro(rows=slice(None)) -> Batch:
    return Batch({"response_mask": MASK[rows], "old_log_probs": OLD[rows],
                  "rollout_log_probs": ROLLOUT[rows], "advantages": ADV[rows]})


def test_only_a_corrected_loss_reads_the_behaviour_log_probs():
    assert loss_spec(ops.PolicyLoss()).reads == ("old_log_probs", "advantages")
    assert loss_spec(ops.PolicyLoss(off_policy="tis")).reads == (
        "old_log_probs", "advantages", "rollout_log_probs")
    assert loss_spec(ops.PolicyLoss(off_policy="decoupled", kl_coef=0.1)).reads == (
        "old_log_probs", "advantages", "rollout_log_probs", "ref_log_prob")


def test_without_a_correction_the_loss_is_the_plain_surrogate_bit_for_bit():
    data = micro()
    logp = OLD + torch.tensor([[0.1, -0.3, 0.05], [0.4, 0.0, 0.2]])
    loss, parts = ops.PolicyLoss("ppo")(data, Outputs(data, logp))
    expected, metrics = ppo_policy_loss(logp, OLD, ADV, MASK, global_tokens=5.0,
                                        global_seqs=2.0, norm_constant=3.0)
    assert torch.equal(loss, expected)
    assert all(torch.equal(parts[k], metrics[k]) for k in metrics)  # share 1
    assert not any(k.startswith("off_policy/") for k in parts)


@pytest.mark.parametrize("correction, weights", [
    ("tis", [2.0, 1.0, e(-0.5), e(0.3), e(-0.2)]),        # e^1 truncated at 2
    ("decoupled", [0.0, 1.0, e(-0.5), e(0.3), e(-0.2)]),  # e^1 > 2: dropped
])
def test_a_corrected_loss_weighs_each_tokens_surrogate(correction, weights):
    data = micro()
    logp = OLD.clone().requires_grad_(True)  # ratio 1: the surrogate per token is -A
    loss, parts = ops.PolicyLoss("ppo", off_policy=correction, is_cap=2.0)(data,
                                                                          Outputs(data, logp))
    advantages = ADV[MASK.bool()].tolist()
    assert loss.item() == pytest.approx(-sum(a * w for a, w in zip(advantages, weights)) / 5)
    frac = "truncated_frac" if correction == "tis" else "dropped_frac"
    assert parts[f"off_policy/{frac}"].item() == pytest.approx(1 / 5)
    assert parts["off_policy/is_weight_mean"].item() == pytest.approx(sum(weights) / 5)
    assert parts["off_policy/is_weight_max"].item() == pytest.approx(e(1.0))
    assert parts["off_policy/behav_kl"].item() > 0


def test_sequence_level_tis_weighs_each_response_by_its_capped_sequence_weight():
    data = micro()
    loss, _ = ops.PolicyLoss("ppo", off_policy="tis", is_level="sequence", is_cap=1.5)(
        data, Outputs(data, OLD.clone()))
    weights = [1.5] * 3 + [e(0.1)] * 2  # row sums of log w: 0.5 (capped), 0.1
    advantages = ADV[MASK.bool()].tolist()
    assert loss.item() == pytest.approx(-sum(a * w for a, w in zip(advantages, weights)) / 5)


def test_micro_batch_shares_sum_to_the_whole_batchs_loss_and_mean_metrics():
    loss_fn = ops.PolicyLoss("ppo", off_policy="tis", is_cap=2.0)
    whole, whole_parts = loss_fn(micro(), Outputs(micro(), OLD.clone()))
    tokens = MASK.sum().double()  # the mini-batch's count, as the trainer passes it
    halves = [loss_fn(micro(rows), Outputs(micro(rows), OLD[rows].clone(), tokens))
              for rows in (slice(0, 1), slice(1, 2))]
    assert sum(h[0] for h in halves).item() == pytest.approx(whole.item())
    for key in ("is_weight_mean", "truncated_frac", "behav_kl"):
        summed = sum(h[1][f"off_policy/{key}"] for h in halves)
        assert summed.item() == pytest.approx(whole_parts[f"off_policy/{key}"].item()), key


def test_repr_shows_the_correction():
    assert repr(ops.PolicyLoss()) == "ppo_loss(token-mean)"
    assert repr(ops.PolicyLoss(off_policy="tis", is_level="sequence", is_cap=3)) == \
        "ppo_loss(token-mean, tis(sequence, cap=3.0))"
    assert repr(ops.PolicyLoss("gspo", off_policy="decoupled")) == \
        "gspo_loss(token-mean, decoupled(cap=2.0))"


def test_the_factories_take_the_correction_from_config_or_force_one():
    actor = ActorConfig(policy_loss="cispo", off_policy="tis", is_level="sequence", is_cap=4.0)
    from_config = ops.policy_loss(actor)
    assert (from_config.kind, from_config.off_policy, from_config.is_level,
            from_config.is_cap) == ("cispo", "tis", "sequence", 4.0)
    assert ops.policy_loss(ActorConfig()).off_policy == "none"
    forced = ops.tis_loss(ActorConfig(policy_loss="gspo"))
    assert (forced.kind, forced.off_policy) == ("gspo", "tis")
    decoupled = ops.decoupled_ppo_loss(actor)  # ppo, per token, whatever the config says
    assert (decoupled.kind, decoupled.off_policy, decoupled.is_level, decoupled.is_cap) == \
        ("ppo", "decoupled", "token", 4.0)


def test_decoupled_per_sequence_is_refused_when_the_graph_is_built():
    with pytest.raises(ValueError, match="actor.is_level=sequence applies to "
                                         "actor.off_policy=tis only"):
        ops.policy_loss(ActorConfig(off_policy="decoupled", is_level="sequence"))


@pytest.mark.parametrize("override, match", [
    ("actor.off_policy=tsi", r"actor.off_policy='tsi' is not a known off-policy correction; "
                             r"did you mean 'tis'\?"),
    ("actor.is_level=seq", r"actor.is_level='seq' is not a known importance-sampling level"),
    ("actor.is_cap=1", r"actor.is_cap must be greater than 1, got 1.0"),
])
def test_the_config_refuses_an_unknown_correction_naming_the_key(override, match):
    with pytest.raises(ConfigError, match=match):
        build_config(overrides=[override])


def test_the_config_accepts_every_registered_correction():
    for correction in ("none", "tis", "decoupled"):
        assert build_config(overrides=[f"actor.off_policy={correction}"]).actor.off_policy == \
            correction


def test_the_weights_the_loss_uses_are_the_algorithms():
    weights, _ = behaviour_weights(OLD, ROLLOUT, MASK, "tis", 2.0)
    data = micro()
    loss, _ = ops.PolicyLoss("ppo", off_policy="tis")(data, Outputs(data, OLD.clone()))
    expected, _ = ppo_policy_loss(OLD, OLD, ADV, MASK, is_weights=weights, global_tokens=5.0)
    torch.testing.assert_close(loss, expected)
