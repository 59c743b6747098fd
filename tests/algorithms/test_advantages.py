"""Advantage estimators: hand-computed cases, edge cases and properties."""
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

from algorithms import advantages as adv
from algorithms.masked import masked_mean

torch.manual_seed(0)
F64 = torch.float64
FAST = settings(max_examples=40, deadline=None)


def t(rows):
    return torch.tensor(rows, dtype=F64)


# ---------------------------------------------------------------- whiten

def test_whiten_uses_masked_mean_and_bessel_variance():
    x, mask = t([[1.0, 2.0, 100.0], [3.0, 100.0, 100.0]]), t([[1, 1, 0], [1, 0, 0]])
    # valid values 1, 2, 3: mean 2, unbiased var ((1 + 0 + 1) / 2) = 1
    out = adv.whiten(x, mask)
    assert torch.allclose(out[mask.bool()], t([-1.0, 0.0, 1.0]) / math.sqrt(1 + 1e-8))


def test_whiten_needs_two_valid_tokens():
    with pytest.raises(ValueError, match="at least 2 valid tokens, got 1"):
        adv.whiten(t([[1.0, 2.0]]), t([[1, 0]]))


@FAST
@given(st.lists(st.floats(-100, 100), min_size=12, max_size=12),
       st.lists(st.booleans(), min_size=12, max_size=12))
def test_whiten_gives_masked_mean_zero_and_variance_one(values, keep):
    x, mask = t(values).reshape(3, 4), torch.tensor(keep, dtype=F64).reshape(3, 4)
    mask[0, :2] = 1  # at least two valid tokens
    valid = x[mask.bool()]
    if valid.var() < 1e-3:
        return  # a (near) constant input has nothing to normalise
    out = adv.whiten(x, mask)
    assert abs(masked_mean(out, mask).item()) < 1e-6
    assert abs(out[mask.bool()].var().item() - 1.0) < 1e-4


# ---------------------------------------------------------------- gae

def test_gae_hand_computed():
    rewards, values, mask = t([[0.0, 0.0, 1.0]]), t([[0.5, 0.5, 0.5]]), t([[1, 1, 1]])
    a, ret = adv.gae(rewards, values, mask, gamma=0.5, lam=0.5)
    # t=2: delta .5, A .5; t=1: delta -.25, A -.125; t=0: delta -.25, A -.28125
    raw = t([[-0.28125, -0.125, 0.5]])
    assert torch.allclose(ret, raw + values)
    assert torch.allclose(a, adv.whiten(raw, mask))


def test_gae_skips_masked_tokens():
    # the hole (huge reward and value) must not change anything: same as the
    # two-token sequence [r0, r2], [v0, v2]
    rewards, values, mask = t([[0.0, 9.0, 1.0]]), t([[0.5, 7.0, 0.5]]), t([[1, 0, 1]])
    a, ret = adv.gae(rewards, values, mask, gamma=0.5, lam=0.5)
    assert torch.allclose(ret, t([[0.375, 0.0, 1.0]]))
    # valid raw advantages -.125, .5: mean .1875, unbiased var 2 * .3125^2 = .1953125
    assert torch.allclose(a, t([[-0.3125, 0.0, 0.3125]]) / math.sqrt(0.1953125 + 1e-8))


def test_gae_empty_response_is_zero():
    rewards, values = t([[0.0, 1.0], [5.0, 5.0]]), t([[0.2, 0.3], [4.0, 4.0]])
    a, ret = adv.gae(rewards, values, t([[1, 1], [0, 0]]), gamma=1.0, lam=1.0)
    assert torch.equal(a[1], t([0.0, 0.0])) and torch.equal(ret[1], t([0.0, 0.0]))


@FAST
@given(st.integers(2, 5), st.integers(0, 2**31 - 1))
def test_gae_with_holes_equals_gae_on_compacted_sequence(n_valid, seed):
    gen = torch.Generator().manual_seed(seed)
    T = n_valid + 3
    keep = torch.zeros(T, dtype=torch.bool)
    keep[torch.randperm(T, generator=gen)[:n_valid]] = True
    rewards = torch.randn(1, T, generator=gen, dtype=F64)
    values = torch.randn(1, T, generator=gen, dtype=F64)
    _, ret = adv.gae(rewards, values, keep[None].to(F64), gamma=0.9, lam=0.8)
    _, ret_compact = adv.gae(rewards[:, keep], values[:, keep], torch.ones(1, n_valid, dtype=F64),
                             0.9, 0.8)
    assert torch.allclose(ret[:, keep], ret_compact)
    assert torch.equal(ret[:, ~keep], torch.zeros(1, T - n_valid, dtype=F64))


# ---------------------------------------------------------------- grpo / dr_grpo

def test_grpo_hand_computed_with_equal_group_and_group_of_one():
    scores, mask = t([1.0, 0.0, 1.0, 1.0, 5.0]), t([[1, 1]] * 4 + [[1, 0]])
    a, ret = adv.grpo(scores, ["a", "a", "b", "b", "c"], mask)
    std_a = math.sqrt(0.5)  # unbiased std of {1, 0}
    expected = [0.5 / (std_a + 1e-6), -0.5 / (std_a + 1e-6), 0.0, 0.0, 5.0 / (1 + 1e-6)]
    assert torch.allclose(a[:, 0], t(expected))
    assert torch.allclose(a[:4, 1], t(expected[:4])) and a[4, 1] == 0  # broadcast, then masked
    assert torch.equal(a, ret)


def test_dr_grpo_does_not_divide_by_std():
    a, _ = adv.dr_grpo(t([1.0, 0.0, 1.0, 1.0, 5.0]), ["a", "a", "b", "b", "c"],
                       torch.ones(5, 1, dtype=F64))
    assert torch.allclose(a[:, 0], t([0.5, -0.5, 0.0, 0.0, 5.0]))


def test_group_ids_may_be_strings_numpy_or_tensors():
    scores, mask = t([3.0, 1.0, 2.0, 7.0]), torch.ones(4, 2, dtype=F64)
    ref, _ = adv.grpo(scores, ["x", "y", "x", "y"], mask)
    for ids in (np.array(["x", "y", "x", "y"]), torch.tensor([4, 9, 4, 9]), [0, 1, 0, 1]):
        assert torch.equal(adv.grpo(scores, ids, mask)[0], ref)


def test_group_length_must_match_scores():
    with pytest.raises(ValueError, match="3 ids but scores has 2"):
        adv.grpo(t([1.0, 2.0]), [0, 0, 1], torch.ones(2, 1))


def test_integer_scores_are_accepted():
    a, _ = adv.grpo(torch.tensor([1, 0]), [0, 0], torch.ones(2, 1))
    assert a.is_floating_point() and a[0, 0] > 0 > a[1, 0]


@FAST
@given(st.lists(st.tuples(st.floats(-10, 10), st.integers(0, 3)), min_size=1, max_size=12))
def test_grpo_and_rloo_advantages_sum_to_zero_within_each_group(rows):
    scores, ids = t([s for s, _ in rows]), [g for _, g in rows]
    mask = torch.ones(len(rows), 3, dtype=F64)
    for estimator in (adv.grpo, adv.dr_grpo, adv.rloo):
        a, _ = estimator(scores, ids, mask)
        for g in set(ids):
            members = [i for i, gid in enumerate(ids) if gid == g]
            if len(members) > 1:
                assert abs(a[members, 0].sum().item()) < 1e-6 * (1 + scores.abs().max().item())


# ---------------------------------------------------------------- rloo

def test_rloo_is_score_minus_mean_of_the_others():
    a, _ = adv.rloo(t([1.0, 0.0, 2.0, 4.0]), [0, 0, 0, 1], t([[1, 1], [1, 0], [1, 1], [0, 1]]))
    # 1 - (0+2)/2 = 0; 0 - 1.5 = -1.5; 2 - 0.5 = 1.5; group of one keeps 4
    assert torch.allclose(a, t([[0.0, 0.0], [-1.5, 0.0], [1.5, 1.5], [0.0, 4.0]]))


# ---------------------------------------------------------------- reinforce++

def test_reinforce_pp_discounted_return():
    a, ret = adv.reinforce_pp(t([[0.0, 0.0, 1.0], [0.0, 2.0, 0.0]]), t([[1, 1, 1], [1, 1, 0]]),
                              gamma=0.5)
    assert torch.allclose(ret, t([[0.25, 0.5, 1.0], [1.0, 2.0, 0.0]]))
    assert torch.allclose(a, adv.whiten(ret, t([[1, 1, 1], [1, 1, 0]])) * t([[1, 1, 1], [1, 1, 0]]))


def test_reinforce_pp_carries_the_return_through_holes():
    a, ret = adv.reinforce_pp(t([[0.0, 5.0, 1.0]]), t([[1, 0, 1]]), gamma=0.5)
    # t=2: G=1; t=1 skipped (reward 5 ignored, return 0); t=0: G = 0 + .5 * 1
    assert torch.allclose(ret, t([[0.5, 0.0, 1.0]]))
    assert torch.allclose(a, t([[-1.0, 0.0, 1.0]]) * math.sqrt(0.5), atol=1e-6)


def test_reinforce_pp_baseline_centres_by_group_then_whitens():
    mask = t([[1, 1], [1, 0], [1, 1]])
    a, ret = adv.reinforce_pp_baseline(t([1.0, 0.0, 3.0]), ["a", "a", "b"], mask)
    # centred: .5 .5 | -.5 | 3 3 (group of one keeps s); mean 1.3, unbiased var 10.3 / 4
    valid = (t([0.5, 0.5, -0.5, 3.0, 3.0]) - 1.3) / math.sqrt(10.3 / 4 + 1e-8)
    assert torch.allclose(a[mask.bool()], valid) and a[1, 1] == 0
    assert torch.equal(a, ret)


# ---------------------------------------------------------------- remax

def test_remax_reward_to_go_minus_baseline():
    a, ret = adv.remax(t([[0.0, 1.0, 2.0], [3.0, 0.0, 0.0]]), t([0.5, 1.0]),
                       t([[1, 1, 0], [0, 0, 0]]))
    assert torch.allclose(ret, t([[1.0, 1.0, 0.0], [0.0, 0.0, 0.0]]))
    assert torch.allclose(a, t([[0.5, 0.5, 0.0], [0.0, 0.0, 0.0]]))


# ---------------------------------------------------------------- common

@pytest.mark.parametrize("name", ["grpo", "dr_grpo", "rloo", "reinforce_pp_baseline"])
def test_outcome_estimators_are_zero_where_masked_and_carry_no_gradient(name):
    scores = torch.tensor([1.0, 2.0, 0.0, 5.0], requires_grad=True)
    mask = torch.tensor([[1, 0, 1], [1, 1, 0], [0, 0, 0], [1, 1, 1]], dtype=torch.float32)
    a, _ = adv.get_advantage(name)(scores, [0, 0, 1, 1], mask)
    assert a.shape == (4, 3) and torch.all(a[mask == 0] == 0) and not a.requires_grad


def test_registry_lookup_and_error():
    assert adv.ADVANTAGES["grpo"] is adv.grpo and adv.get_advantage("gae") is adv.gae
    with pytest.raises(ValueError, match=r"unknown advantage estimator 'ppo2'.*gae.*grpo.*remax"):
        adv.get_advantage("ppo2")


def test_bool_and_float_masks_agree():
    gen = torch.Generator().manual_seed(5)
    rewards = torch.randn(3, 4, generator=gen, dtype=F64)
    values = torch.randn(3, 4, generator=gen, dtype=F64)
    mask = torch.tensor([[1, 1, 0, 1], [1, 0, 0, 0], [0, 0, 0, 0]], dtype=torch.bool)
    for (a, r), (a2, r2) in [(adv.gae(rewards, values, mask, 0.9, 0.95),
                              adv.gae(rewards, values, mask.to(F64), 0.9, 0.95)),
                             (adv.reinforce_pp(rewards, mask, 0.9),
                              adv.reinforce_pp(rewards, mask.to(F64), 0.9))]:
        assert torch.equal(a, a2) and torch.equal(r, r2)
