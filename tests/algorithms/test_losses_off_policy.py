"""Off-policy corrections (algorithms/losses.py `behaviour_weights` and the surrogates'
`is_weights`): the weights and metrics against a hand computation on two responses
of 3 tokens (the second one token shorter), token and sequence TIS with the cap hit
and not hit, decoupled PPO's dropped tokens, and no weights = the loss unchanged."""
import math

import pytest
import torch

from algorithms import losses

F64 = torch.float64
MASK = torch.tensor([[1, 1, 1], [1, 1, 0]])
# log w = old - rollout: [[1.0, 0.0, -0.5], [0.3, -0.2, (padding: 5.0, ignored)]]
ROLLOUT = torch.tensor([[-2.0, -0.5, -0.7], [-0.6, -0.8, -6.0]], dtype=F64)
OLD = torch.tensor([[-1.0, -0.5, -1.2], [-0.3, -1.0, -1.0]], dtype=F64)
LOG_W = [1.0, 0.0, -0.5, 0.3, -0.2]  # the 5 valid tokens, row by row
e = math.exp


def weights(correction="tis", cap=2.0, level="token"):
    return losses.behaviour_weights(OLD, ROLLOUT, MASK, correction, cap, level)


def valid(w: torch.Tensor) -> list[float]:
    return w[MASK.bool()].tolist()


def k3_mean() -> float:
    return sum(e(x) - 1 - x for x in LOG_W) / 5


def test_token_tis_truncates_only_the_weights_above_the_cap():
    w, m = weights("tis", cap=2.0)
    expected = [2.0, 1.0, e(-0.5), e(0.3), e(-0.2)]  # e^1 = 2.718 capped at 2
    assert valid(w) == pytest.approx(expected)
    assert m["is_weight_mean"].item() == pytest.approx(sum(expected) / 5)
    assert m["is_weight_max"].item() == pytest.approx(e(1.0))  # before the cap
    assert m["truncated_frac"].item() == pytest.approx(1 / 5)
    assert m["behav_kl"].item() == pytest.approx(k3_mean())
    assert "dropped_frac" not in m and not w.requires_grad


def test_token_tis_with_a_high_cap_keeps_every_weight():
    w, m = weights("tis", cap=3.0)
    assert valid(w) == pytest.approx([e(x) for x in LOG_W])
    assert m["truncated_frac"].item() == 0.0


def test_sequence_tis_gives_every_token_its_sequences_capped_weight():
    # sums over the valid tokens: row 0: 1 + 0 - 0.5 = 0.5, row 1: 0.3 - 0.2 = 0.1
    w, m = weights("tis", cap=2.0, level="sequence")
    assert w[0].tolist() == pytest.approx([e(0.5)] * 3)
    assert valid(w)[3:] == pytest.approx([e(0.1)] * 2)  # the padding's 5.0 is not summed
    assert m["truncated_frac"].item() == 0.0
    w, m = weights("tis", cap=1.5, level="sequence")  # e^0.5 = 1.65 > 1.5
    assert valid(w) == pytest.approx([1.5] * 3 + [e(0.1)] * 2)
    assert m["truncated_frac"].item() == pytest.approx(3 / 5)  # row 0's three tokens
    assert m["is_weight_max"].item() == pytest.approx(e(0.5))
    assert m["behav_kl"].item() == pytest.approx(k3_mean())  # per token whatever the level


def test_decoupled_drops_the_tokens_above_the_cap_and_keeps_the_rest_uncapped():
    w, m = weights("decoupled", cap=2.0)
    assert valid(w) == pytest.approx([0.0, 1.0, e(-0.5), e(0.3), e(-0.2)])
    assert m["dropped_frac"].item() == pytest.approx(1 / 5)
    assert m["is_weight_mean"].item() == pytest.approx((1 + e(-0.5) + e(0.3) + e(-0.2)) / 5)
    assert "truncated_frac" not in m


def test_the_weights_stay_finite_however_stale_the_samples():
    old = torch.tensor([[0.0, 0.0]], dtype=F64)
    rollout = torch.tensor([[-500.0, 500.0]], dtype=F64)
    for correction in ("tis", "decoupled"):
        w, m = losses.behaviour_weights(old, rollout, torch.ones(1, 2), correction, 2.0)
        assert torch.isfinite(w).all() and all(torch.isfinite(v) for v in m.values())
    w, _ = losses.behaviour_weights(old, rollout, torch.ones(1, 2), "tis", 2.0)
    assert w[0].tolist() == pytest.approx([2.0, 0.0])


@pytest.mark.parametrize("settings, match", [
    (("tsi", "token", 2.0), r"unknown off-policy correction 'tsi' \(actor.off_policy\)"),
    (("tis", "seq", 2.0), r"'seq' \(actor.is_level\)"),
    (("decoupled", "sequence", 2.0), r"actor.is_level=sequence applies to actor.off_policy=tis"),
    (("tis", "token", 1.0), r"actor.is_cap must be > 1"),
    (("none", "token", 2.0), r"needs a correction"),
])
def test_invalid_settings_are_refused_naming_the_config_key(settings, match):
    correction, level, cap = settings
    with pytest.raises(ValueError, match=match):
        losses.behaviour_weights(OLD, ROLLOUT, MASK, correction, cap, level)


def test_ppo_loss_is_the_weighted_token_mean_and_a_dropped_token_gets_no_gradient():
    w, _ = weights("decoupled", cap=2.0)
    log_prob = OLD.clone().requires_grad_(True)  # ratio 1: the per-token loss is -A
    advantages = torch.tensor([[1.0, -1.0, 2.0], [0.5, 1.0, 9.0]], dtype=F64)
    loss, _ = losses.ppo_policy_loss(log_prob, OLD, advantages, MASK, is_weights=w)
    kept = [0.0, 1.0, e(-0.5), e(0.3), e(-0.2)]
    a = valid(advantages)
    assert loss.item() == pytest.approx(-sum(x * y for x, y in zip(a, kept)) / 5)  # N counts all 5
    loss.backward()
    assert log_prob.grad[0, 0].item() == 0.0  # dropped
    assert valid(log_prob.grad)[1:] == pytest.approx([-x * y / 5 for x, y in zip(a[1:], kept[1:])])


@pytest.mark.parametrize("name", ["ppo", "gspo", "cispo"])
def test_unit_weights_leave_every_surrogate_bit_identical(name):
    gen = torch.Generator().manual_seed(5)
    new, old, adv = (torch.randn(2, 3, generator=gen) for _ in range(3))
    fn = losses.get_policy_loss(name)
    plain, plain_m = fn(new, old, adv, MASK, mode="token-mean")
    none, _ = fn(new, old, adv, MASK, mode="token-mean", is_weights=None)
    ones, ones_m = fn(new, old, adv, MASK, mode="token-mean", is_weights=torch.ones(2, 3))
    assert torch.equal(plain, none) and torch.equal(plain, ones)
    assert all(torch.equal(plain_m[k], ones_m[k]) for k in plain_m)
    halves, _ = fn(new, old, adv, MASK, mode="token-mean", is_weights=torch.full((2, 3), 0.5))
    torch.testing.assert_close(halves, plain / 2)  # the weights do reach the loss
