"""KL estimators, straight-through variants, controllers and the in-reward penalty."""
import math

import pytest
import torch
from hypothesis import given, settings, strategies as st

from algorithms import kl

torch.manual_seed(0)
F64 = torch.float64


def t(rows):
    return torch.tensor(rows, dtype=F64)


LP, REF = t([[-1.0, -2.0, -0.5]]), t([[-2.0, -1.0, -0.5]])


@pytest.mark.parametrize("kind, expected", [
    ("k1", [1.0, -1.0, 0.0]),
    ("abs", [1.0, 1.0, 0.0]),
    ("k2", [0.5, 0.5, 0.0]),
    # d = ref - lp = -1, 1, 0: exp(d) - d - 1
    ("k3", [math.exp(-1), math.exp(1) - 2, 0.0]),
])
def test_kl_kinds_hand_computed(kind, expected):
    assert torch.allclose(kl.kl_penalty(LP, REF, kind), t([expected]))


@pytest.mark.parametrize("alias, kind",
                         [("kl", "k1"), ("mse", "k2"), ("low_var_kl", "k3"),
                          ("low_var_kl+", "k3+")])
def test_verl_names_are_aliases(alias, kind):
    assert torch.equal(kl.kl_penalty(LP, REF, alias), kl.kl_penalty(LP, REF, kind))


def test_k3_is_clamped():
    # d = 30 -> clamped to 20 -> exp(20) - 21 -> clamped to 10; d = -5 -> exp(-5) + 4, unclamped
    lp = t([[0.0, 0.0]]).requires_grad_()
    out = kl.kl_penalty(lp, t([[30.0, -5.0]]), "k3")
    assert torch.allclose(out, t([[10.0, math.exp(-5) + 4.0]]))
    out.sum().backward()
    assert lp.grad[0, 0] == 0  # a clamped token does not push the policy


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.floats(-30, 0), st.floats(-30, 0)), min_size=1, max_size=10))
def test_k3_is_non_negative_and_zero_at_equality(pairs):
    lp, ref = t([[a for a, _ in pairs]]), t([[b for _, b in pairs]])
    out = kl.kl_penalty(lp, ref, "k3")
    assert torch.all(out >= 0)
    assert torch.all(out[lp == ref] == 0)


@pytest.mark.parametrize("kind", ["k3+", "k1+", "abs+"])
def test_plus_kinds_have_their_value_and_k2_gradient(kind):
    gen = torch.Generator().manual_seed(4)
    lp = torch.randn(2, 4, generator=gen, dtype=F64).requires_grad_()
    ref = torch.randn(2, 4, generator=gen, dtype=F64)
    out = kl.kl_penalty(lp, ref, kind)
    assert torch.allclose(out, kl.kl_penalty(lp, ref, kind[:-1]))
    out.sum().backward()
    assert torch.allclose(lp.grad, (lp - ref).detach())  # d/dlp of 0.5 * (lp - ref)^2


def test_plain_k3_gradient_differs_from_k2():
    lp = t([[-1.0]]).requires_grad_()
    kl.kl_penalty(lp, t([[-2.0]]), "k3").sum().backward()
    # d/dlp [exp(ref - lp) - (ref - lp) - 1] = 1 - exp(ref - lp)
    assert lp.grad.item() == pytest.approx(1 - math.exp(-1))


def test_unknown_kind_names_the_valid_ones():
    with pytest.raises(ValueError, match=r"unknown KL kind 'k4'.*k1, abs, k2, k3"):
        kl.kl_penalty(LP, REF, "k4")


def test_fixed_controller_never_moves():
    ctrl = kl.FixedKL(0.05)
    ctrl.update(10.0, n_steps=100)
    assert ctrl.beta == 0.05


@pytest.mark.parametrize("measured, expected", [
    (2.0, 0.1 * (1 + 0.2 * 4 / 10)),   # error clipped at +0.2
    (1.1, 0.1 * (1 + 0.1 * 4 / 10)),
    (0.0, 0.1 * (1 - 0.2 * 4 / 10)),   # error clipped at -0.2
])
def test_adaptive_controller_update(measured, expected):
    ctrl = kl.AdaptiveKL(init_beta=0.1, target=1.0, horizon=10)
    ctrl.update(measured, n_steps=4)
    assert ctrl.beta == pytest.approx(expected)


def test_adaptive_controller_validates_its_settings():
    with pytest.raises(ValueError, match="target > 0 and horizon > 0"):
        kl.AdaptiveKL(0.1, target=0.0, horizon=10)


def test_apply_kl_in_reward_penalises_valid_tokens_and_measures_per_sequence_mean():
    rewards = t([[0.0, 0.0, 1.0], [0.0, 2.0, 0.0], [5.0, 5.0, 5.0]])
    lp = t([[-1.0, -1.0, -1.0], [-1.0, -1.0, -1.0], [0.0, 0.0, 0.0]])
    ref = t([[-2.0, -1.5, -9.0], [-1.5, -1.0, -1.0], [-9.0, -9.0, -9.0]])
    mask = t([[1, 1, 0], [1, 1, 1], [0, 0, 0]])  # a padded tail and an empty response
    ctrl = kl.AdaptiveKL(init_beta=0.5, target=1.0, horizon=6)
    penalised, measured = kl.apply_kl_in_reward(rewards, lp, ref, mask, ctrl, kind="k1")
    assert torch.allclose(penalised,
                          rewards - 0.5 * t([[1.0, 0.5, 0.0], [0.5, 0.0, 0.0], [0.0, 0.0, 0.0]]))
    # per-sequence means 0.75 and 1/6; the empty sequence is left out
    assert measured == pytest.approx((0.75 + 0.5 / 3) / 2)
    # error = clip(0.458 - 1, -0.2, 0.2) = -0.2, n_steps = B = 3
    assert ctrl.beta == pytest.approx(0.5 * (1 - 0.2 * 3 / 6))
