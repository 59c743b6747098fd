"""Aggregation, policy losses, value loss and entropy."""
import math

import pytest
import torch
from hypothesis import given, settings, strategies as st

from algorithms import losses

torch.manual_seed(0)
F64 = torch.float64
FAST = settings(max_examples=40, deadline=None)


def t(rows):
    return torch.tensor(rows, dtype=F64)


VALUES = t([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0]])
HOLES = t([[1, 0, 1], [1, 0, 0], [0, 0, 0]])  # a hole, a short response, an empty one


# ---------------------------------------------------------------- aggregate

@pytest.mark.parametrize("mode, expected", [
    ("token-mean", (1 + 3 + 4) / 3),
    ("seq-mean-token-sum", (4 + 4) / 2),           # the empty sequence is left out
    ("seq-mean-token-mean", (2 + 4) / 2),
    ("seq-mean-token-sum-norm", (4 + 4) / 2 / 3),  # divided by T = 3
])
def test_aggregate_hand_computed(mode, expected):
    assert losses.aggregate(VALUES, HOLES, mode).item() == pytest.approx(expected)


def test_aggregate_sum_norm_by_a_given_constant():
    loss = losses.aggregate(VALUES, HOLES, "seq-mean-token-sum-norm", norm_constant=8)
    assert loss.item() == pytest.approx(0.5)


def test_aggregate_ignores_non_finite_values_at_masked_positions():
    values = VALUES.clone()
    values[0, 1], values[2, 0] = float("nan"), float("inf")
    for mode in losses.AGG_MODES:
        assert losses.aggregate(values, HOLES, mode) == losses.aggregate(VALUES, HOLES, mode)


@pytest.mark.parametrize("mode", losses.AGG_MODES)
def test_aggregate_of_all_empty_responses_is_zero_with_zero_gradient(mode):
    values = torch.ones(2, 3, dtype=F64, requires_grad=True)
    loss = losses.aggregate(values, torch.zeros(2, 3, dtype=F64), mode)
    loss.backward()
    assert loss.item() == 0.0 and torch.equal(values.grad, torch.zeros(2, 3, dtype=F64))


def test_aggregate_rejects_unknown_mode():
    with pytest.raises(ValueError, match="unknown aggregation mode 'mean'.*token-mean"):
        losses.aggregate(VALUES, HOLES, "mean")


def _shards(n_rows, cuts):
    bounds = [0] + sorted(set(c % (n_rows + 1) for c in cuts)) + [n_rows]
    return [(a, b) for a, b in zip(bounds, bounds[1:])]


@FAST
@given(st.sampled_from(losses.AGG_MODES), st.lists(st.integers(0, 6), max_size=3),
       st.integers(0, 2**31 - 1))
def test_aggregate_split_across_ranks_with_global_normalisers_sums_to_unsplit(mode, cuts, seed):
    gen = torch.Generator().manual_seed(seed)
    values = torch.randn(6, 5, generator=gen, dtype=F64)
    mask = (torch.rand(6, 5, generator=gen) < 0.6).to(F64)
    full = losses.aggregate(values, mask, mode)
    shards = _shards(6, cuts)
    counts = [losses.local_normalizers(mask[a:b]) for a, b in shards]  # the all-reduce
    tokens, seqs = sum(c[0] for c in counts), sum(c[1] for c in counts)
    split = sum(losses.aggregate(values[a:b], mask[a:b], mode, global_tokens=tokens,
                                 global_seqs=seqs)
                for a, b in shards)
    assert torch.allclose(split, full)


def test_local_normalisers_alone_would_change_the_loss():
    # the reason global normalisers exist: shards of unequal token counts
    values, mask = t([[1.0, 1.0], [5.0, 0.0]]), t([[1, 1], [1, 0]])
    full = losses.aggregate(values, mask, "token-mean")
    local_avg = (losses.aggregate(values[:1], mask[:1])
                 + losses.aggregate(values[1:], mask[1:])) / 2
    assert full.item() == pytest.approx(7 / 3) and local_avg.item() == pytest.approx(3.0)


# ---------------------------------------------------------------- ppo

def _ppo_case():
    # ratios 1.5, 1.5, 5, 0.5 for advantages 1, -1, -1, 1
    advantages = t([[1.0, -1.0, -1.0, 1.0]])
    old = t([[-1.0, -1.0, -1.0, -1.0]])
    new = old + t([[math.log(1.5), math.log(1.5), math.log(5.0), math.log(0.5)]])
    return new.requires_grad_(), old, advantages, torch.ones(1, 4, dtype=F64)


def test_ppo_loss_hand_computed():
    new, old, advantages, mask = _ppo_case()
    loss, m = losses.ppo_policy_loss(new, old, advantages, mask)
    # per token: clipped -1.2 | unclipped 1.5 | dual clip 3 (not 5) | unclipped -0.5
    assert loss.item() == pytest.approx((-1.2 + 1.5 + 3.0 - 0.5) / 4)
    assert m["pg_clipfrac"].item() == pytest.approx(0.25)  # token 0
    assert m["pg_clipfrac_lower"].item() == pytest.approx(0.25)  # token 2
    kl = -(2 * math.log(1.5) + math.log(5.0) + math.log(0.5)) / 4
    assert m["ppo_kl"].item() == pytest.approx(kl)
    assert not any(v.requires_grad for v in m.values())


def test_ppo_clipped_tokens_get_no_gradient():
    new, old, advantages, mask = _ppo_case()
    losses.ppo_policy_loss(new, old, advantages, mask)[0].backward()
    # d(-A * r)/d log_prob = -A * r / 4 for the unclipped tokens 1 and 3
    assert torch.allclose(new.grad, t([[0.0, 1.5 / 4, 0.0, -0.5 / 4]]))


def test_ppo_asymmetric_clip_range():
    new = t([[math.log(1.25)]])
    loss, m = losses.ppo_policy_loss(new, torch.zeros(1, 1, dtype=F64), t([[1.0]]),
                                     torch.ones(1, 1),
                                     clip_low=0.2, clip_high=0.28)
    assert loss.item() == pytest.approx(-1.25) and m["pg_clipfrac"].item() == 0.0  # 1.25 < 1.28


def test_ppo_rejects_dual_clip_below_one():
    new, old, advantages, mask = _ppo_case()
    with pytest.raises(ValueError, match="clip_c must be > 1"):
        losses.ppo_policy_loss(new, old, advantages, mask, clip_c=1.0)


@FAST
@given(st.lists(st.tuples(st.floats(-5, 5), st.floats(-30, 30)), min_size=1, max_size=8),
       st.floats(1.01, 10.0))
def test_ppo_dual_clip_never_exceeds_clip_c_times_abs_advantage(rows, clip_c):
    advantages, log_ratio = t([[a for a, _ in rows]]), t([[r for _, r in rows]])
    for j in range(len(rows)):  # a one-hot mask reads a single token's loss
        one_hot = torch.zeros_like(advantages)
        one_hot[0, j] = 1
        loss, _ = losses.ppo_policy_loss(log_ratio, torch.zeros_like(log_ratio), advantages,
                                         one_hot, clip_c=clip_c)
        assert loss.item() <= clip_c * abs(rows[j][0]) + 1e-9


def test_ppo_split_across_ranks_matches_unsplit():
    gen = torch.Generator().manual_seed(1)
    new, old, a = (torch.randn(4, 6, generator=gen, dtype=F64) for _ in range(3))
    mask = t([[1, 1, 1, 0, 0, 0], [1] * 6, [1, 0, 0, 0, 0, 0], [0] * 6])
    for mode in losses.AGG_MODES:
        full, _ = losses.ppo_policy_loss(new, old, a, mask, mode=mode)
        kw = dict(mode=mode, global_tokens=mask.sum(), global_seqs=3, norm_constant=6)
        parts = [losses.ppo_policy_loss(new[s], old[s], a[s], mask[s], **kw)[0]
                 for s in (slice(0, 1), slice(1, 4))]
        assert torch.allclose(parts[0] + parts[1], full)


# ---------------------------------------------------------------- gspo

def test_gspo_uses_the_sequence_ratio_on_every_token():
    old = torch.zeros(2, 3, dtype=F64)
    new = t([[0.2, 0.4, 9.0], [-0.1, -0.1, -0.1]])  # the 9.0 sits in a hole
    mask, a = t([[1, 1, 0], [1, 1, 1]]), t([[1.0, 1.0, 1.0], [-2.0, -2.0, -2.0]])
    loss, m = losses.gspo_policy_loss(new, old, a, mask, clip_low=1.0, clip_high=1.0)
    s = (math.exp(0.3), math.exp(-0.1))  # exp of the masked mean log ratio
    assert loss.item() == pytest.approx((-s[0] + 2 * s[1]) / 2)
    assert m["pg_clipfrac"].item() == 0.0 and m["pg_clipfrac_lower"].item() == 0.0


def test_gspo_straight_through_gradient_equals_sequence_level_gradient():
    gen = torch.Generator().manual_seed(2)
    old = torch.randn(3, 5, generator=gen, dtype=F64)
    new = (old + 0.1 * torch.randn(3, 5, generator=gen, dtype=F64)).requires_grad_()
    mask = t([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [0, 1, 1, 0, 1]])
    seq_a = t([0.7, -1.3, 0.4])
    loss, _ = losses.gspo_policy_loss(new, old, seq_a[:, None].expand(3, 5), mask, clip_low=10.0,
                                      clip_high=10.0)
    loss.backward()
    # the GSPO objective itself: mean over sequences of -A_i * s_i(theta)
    new2 = new.detach().clone().requires_grad_()
    s = torch.exp(((new2 - old) * mask).sum(-1) / mask.sum(-1))
    (-(seq_a * s).mean()).backward()
    assert torch.allclose(new.grad, new2.grad)
    assert torch.equal(new.grad[mask == 0], torch.zeros(int((mask == 0).sum()), dtype=F64))


def test_gspo_clipped_sequence_gets_no_gradient():
    new = t([[0.5, 0.5]]).requires_grad_()  # ratio e^.5, far outside 1 + 4e-4
    loss, m = losses.gspo_policy_loss(new, torch.zeros(1, 2, dtype=F64), t([[1.0, 1.0]]),
                                      torch.ones(1, 2))
    loss.backward()
    assert loss.item() == pytest.approx(-(1 + 4e-4)) and m["pg_clipfrac"].item() == 1.0
    assert torch.equal(new.grad, torch.zeros(1, 2, dtype=F64))


# ---------------------------------------------------------------- cispo

def test_cispo_keeps_gradient_with_a_clipped_constant_weight():
    old = torch.zeros(1, 3, dtype=F64)
    new = t([[math.log(2.0), math.log(0.5), math.log(1.1)]]).requires_grad_()
    a = t([[1.0, 1.0, -1.0]])
    loss, m = losses.cispo_policy_loss(new, old, a, torch.ones(1, 3))
    loss.backward()
    weight = t([[1.2, 0.8, 1.1]])  # clamp(ratio, 0.8, 1.2)
    assert loss.item() == pytest.approx((-(weight * a * new.detach()).sum() / 3).item())
    assert torch.allclose(new.grad, -weight * a / 3)  # no token loses its gradient
    assert m["pg_clipfrac"].item() == pytest.approx(2 / 3)
    assert m["pg_clipfrac_lower"].item() == pytest.approx(1 / 3)


def test_policy_loss_registry():
    assert losses.get_policy_loss("ppo") is losses.ppo_policy_loss
    assert set(losses.POLICY_LOSSES) == {"ppo", "gspo", "cispo"}
    with pytest.raises(ValueError, match=r"unknown policy loss 'trpo'.*cispo, gspo, ppo"):
        losses.get_policy_loss("trpo")


@pytest.mark.parametrize("name", ["ppo", "gspo", "cispo"])
def test_policy_losses_share_one_signature_and_metric_keys(name):
    gen = torch.Generator().manual_seed(3)
    new, old, a = (torch.randn(2, 3, generator=gen) for _ in range(3))
    loss, m = losses.get_policy_loss(name)(new, old, a, torch.ones(2, 3), clip_low=0.2,
                                           clip_high=0.3,
                                          mode="token-mean", global_tokens=6)
    assert loss.dim() == 0 and set(m) == {"pg_clipfrac", "ppo_kl", "pg_clipfrac_lower"}


# ---------------------------------------------------------------- value loss

def test_value_loss_hand_computed():
    values, old, returns = t([[1.0, 0.2, 99.0]]), t([[0.0, 0.0, 0.0]]), t([[2.0, 2.0, 0.0]])
    loss, m = losses.value_loss(values, old, returns, t([[1, 1, 0]]), clip=0.5)
    # token 0: v clipped to .5 -> max(1, 2.25) = 2.25; token 1: inside, 3.24
    assert loss.item() == pytest.approx(0.5 * (2.25 + 3.24) / 2)
    assert m["vf_clipfrac"].item() == pytest.approx(0.5)


# ---------------------------------------------------------------- entropy

def test_entropy_hand_computed_and_stable():
    logits = t([[0.0, 0.0, 0.0, 0.0], [1000.0, 0.0, 0.0, 0.0], [-1000.0, -1000.0, 5.0, 5.0]])
    assert torch.allclose(losses.entropy_from_logits(logits), t([math.log(4), 0.0, math.log(2)]))


def test_entropy_chunking_matches_categorical_and_keeps_shape_and_gradient():
    logits = torch.randn(3, 5, 11, dtype=F64, requires_grad=True)
    chunked = losses.entropy_from_logits(logits, chunk_size=4)
    assert chunked.shape == (3, 5)
    assert torch.allclose(chunked, torch.distributions.Categorical(logits=logits).entropy())
    assert torch.allclose(chunked, losses.entropy_from_logits(logits))
    chunked.sum().backward()
    assert logits.grad is not None and torch.isfinite(logits.grad).all()


def test_entropy_upcasts_half_precision_and_handles_empty_input():
    half = torch.zeros(2, 8, dtype=torch.bfloat16)
    assert losses.entropy_from_logits(half).dtype == torch.float32
    assert losses.entropy_from_logits(torch.zeros(0, 4, 8)).shape == (0, 4)
