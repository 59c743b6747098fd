"""graphs/ops.py: each adapter reads the keys it declares, writes exactly the keys it
declares, with the shapes of the batch, and the values of the `algorithms/` function
it adapts, on a small hand-made batch: 4 responses of 3 tokens, 2 prompts (uid a, b)
of 2 samples each, the last response one token shorter."""
from __future__ import annotations

import pytest
import torch

from algorithms import advantages as adv
from algorithms.kl import AdaptiveKL, FixedKL, apply_kl_in_reward
from graphs import ops
from hybridflow import Batch
from hybridflow.graph.builder import fn_spec

B, T = 4, 3
MASK = torch.tensor([[1, 1, 1], [1, 1, 1], [1, 1, 1], [1, 1, 0]])
UID = ["a", "a", "b", "b"]


def batch(**extra) -> Batch:
    tensors = {
        "response_mask": MASK,
        "scores": torch.tensor([1.0, 0.0, 1.0, 1.0]),
        "token_level_scores": torch.tensor([[0, 0, 1.0], [0, 0, 0], [0, 0, 1.0], [0, 1.0, 0]]),
        "token_level_rewards": torch.tensor([[0, 0.5, 1.0], [0, 0, -1.0], [0.25, 0, 1.0],
                                             [0, 1.0, 0]]),
        "values": torch.tensor([[0.1, 0.2, 0.3], [0.0, 0.1, 0.0], [0.5, 0.5, 0.5],
                                [0.2, 0.1, 0.0]]),
        "old_log_probs": torch.tensor([[-1.0, -0.5, -0.2]] * B),
        "ref_log_prob": torch.tensor([[-1.2, -0.5, -0.1]] * B),
        "baseline_scores": torch.tensor([0.5, 0.5, 1.0, 1.0]),
        "response_length": torch.tensor([3, 3, 3, 2]),
    }
    tensors.update(extra)
    return Batch(tensors, {"uid": list(UID)})


def call(fn, data: Batch, **kwargs) -> Batch:
    """Run an adapter on only the keys it declares it reads, as the engine feeds it."""
    spec = fn_spec(fn)
    return fn(data.select(*spec.reads), **kwargs)


ADVANTAGE_ADAPTERS = [
    (ops.grpo_advantages, lambda b: adv.grpo(b["scores"], b["uid"], b["response_mask"])),
    (ops.rloo_advantages, lambda b: adv.rloo(b["scores"], b["uid"], b["response_mask"])),
    (ops.reinforce_pp_advantages,
     lambda b: adv.reinforce_pp(b["token_level_rewards"], b["response_mask"], 1.0)),
    (ops.reinforce_pp_baseline_advantages,
     lambda b: adv.reinforce_pp_baseline(b["scores"], b["uid"], b["response_mask"])),
    (ops.remax_advantages,
     lambda b: adv.remax(b["token_level_rewards"], b["baseline_scores"], b["response_mask"])),
    (ops.gae_advantages,
     lambda b: adv.gae(b["token_level_rewards"], b["values"], b["response_mask"], 1.0, 1.0)),
]


@pytest.mark.parametrize("adapter, math", ADVANTAGE_ADAPTERS,
                         ids=[a.__name__ for a, _ in ADVANTAGE_ADAPTERS])
def test_advantage_adapters_write_their_keys_with_the_algorithms_values(adapter, math):
    data = batch()
    out = call(adapter, data)
    assert set(out.keys()) == set(fn_spec(adapter).writes)
    advantages, returns = math(data)
    assert out["advantages"].shape == (B, T)
    torch.testing.assert_close(out["advantages"], advantages)
    if "returns" in fn_spec(adapter).writes:
        torch.testing.assert_close(out["returns"], returns)
    assert torch.all(out["advantages"][MASK == 0] == 0)  # nothing on padding


def test_grpo_normalises_within_each_prompt_and_passes_its_options():
    out = call(ops.grpo_advantages, batch())
    std_a = torch.tensor([1.0, 0.0]).std()  # unbiased, as the algorithm takes it
    expected_a = 0.5 / (std_a + 1e-6)
    torch.testing.assert_close(out["advantages"][:, 0], torch.tensor([expected_a, -expected_a,
                                                                       0.0, 0.0]))
    plain = call(ops.grpo_advantages, batch(), norm_by_std=False)  # Dr.GRPO
    torch.testing.assert_close(plain["advantages"][:, 0], torch.tensor([0.5, -0.5, 0.0, 0.0]))


def test_rloo_baseline_is_the_other_samples_mean():
    out = call(ops.rloo_advantages, batch())
    torch.testing.assert_close(out["advantages"][:, 0], torch.tensor([1.0, -1.0, 0.0, 0.0]))


def test_gae_adapter_passes_gamma_and_lambda():
    data = batch()
    out = call(ops.gae_advantages, data, gamma=0.9, lam=0.5)
    advantages, returns = adv.gae(data["token_level_rewards"], data["values"],
                                  data["response_mask"], 0.9, 0.5)
    torch.testing.assert_close(out["advantages"], advantages)
    torch.testing.assert_close(out["returns"], returns)
    assert not torch.allclose(out["returns"], call(ops.gae_advantages, data)["returns"])


def test_reinforce_pp_adapter_passes_gamma():
    data = batch()
    out = call(ops.reinforce_pp_advantages, data, gamma=0.5)
    _, returns = adv.reinforce_pp(data["token_level_rewards"], data["response_mask"], 0.5)
    torch.testing.assert_close(out["returns"], returns)
    assert out["returns"][0, 0].item() == pytest.approx(0.5 * 0.5 + 0.25 * 1.0)


def test_remax_subtracts_the_greedy_score_from_the_reward_to_go():
    out = call(ops.remax_advantages, batch())
    torch.testing.assert_close(out["returns"][0], torch.tensor([1.5, 1.5, 1.0]))
    torch.testing.assert_close(out["advantages"][0], torch.tensor([1.0, 1.0, 0.5]))
    torch.testing.assert_close(out["advantages"][3], torch.tensor([0.0, 0.0, 0.0]))


def test_repeat_baseline_gives_each_sample_its_prompts_greedy_score():
    out = ops.repeat_baseline(Batch({"baseline_scores": torch.tensor([1, 0])}), n=2)
    assert set(out.keys()) == {"baseline_scores"}
    assert out["baseline_scores"].dtype == torch.float32
    assert out["baseline_scores"].tolist() == [1.0, 1.0, 0.0, 0.0]


def test_scores_to_rewards_copies_the_token_scores():
    data = batch()
    out = call(ops.scores_to_rewards, data)
    assert set(out.keys()) == {"token_level_rewards"}
    assert torch.equal(out["token_level_rewards"], data["token_level_scores"])
    assert out.meta["metrics"]["critic/rewards/mean"] == pytest.approx(3 / 4)  # per response


@pytest.mark.parametrize("target", [None, 0.01])
def test_kl_in_reward_penalises_like_the_algorithm_and_reports_the_coefficient(target):
    node = ops.kl_in_reward("k1", beta=0.1, target=target, horizon=100.0)
    assert isinstance(node, ops.AdaptiveKLInReward if target else ops.KLInReward)
    data = batch()
    out = call(node, data)
    assert set(out.keys()) == set(fn_spec(node).writes) == {"token_level_rewards"}
    controller = AdaptiveKL(0.1, target, 100.0) if target else FixedKL(0.1)
    rewards, kl = apply_kl_in_reward(data["token_level_scores"], data["old_log_probs"],
                                     data["ref_log_prob"], data["response_mask"], controller,
                                     "k1")
    torch.testing.assert_close(out["token_level_rewards"], rewards)
    metrics = out.meta["metrics"]
    assert metrics["actor/reward_kl_penalty"] == pytest.approx(kl)
    assert metrics["actor/reward_kl_penalty_coeff"] == pytest.approx(0.1)  # beta before update
    optimised = (rewards * data["response_mask"]).sum(-1).mean()  # what GAE will read
    assert metrics["critic/rewards/mean"] == pytest.approx(float(optimised))
    assert metrics["critic/rewards/mean"] != pytest.approx(3 / 4)  # the KL shapes it
    assert node.controller.beta == pytest.approx(controller.beta)


def test_adaptive_kl_coefficient_adapts_and_round_trips_its_state():
    node = ops.kl_in_reward("k1", beta=0.1, target=1e-4, horizon=10.0)
    call(node, batch())  # measured KL far above target: the coefficient grows
    assert node.controller.beta > 0.1
    state = node.state_dict()
    fresh = ops.kl_in_reward("k1", beta=0.1, target=1e-4, horizon=10.0)
    fresh.load_state_dict(state)
    assert fresh.controller.beta == node.controller.beta


def test_unknown_kl_kind_is_refused_when_the_graph_is_built():
    with pytest.raises(ValueError, match="unknown KL kind 'k9'.*algorithm.kl_kind"):
        ops.kl_in_reward("k9")


def test_drop_uniform_groups_keeps_groups_whose_scores_differ():
    data = batch()
    out = ops.drop_uniform_groups(data)
    assert list(out["uid"]) == ["a", "a"]  # group b scored 1, 1: no signal
    assert set(out.keys()) == set(data.keys())  # forwards every column
    torch.testing.assert_close(out["scores"], torch.tensor([1.0, 0.0]))
    assert out.meta["metrics"] == {"dapo/dropped_groups_total": 1.0,
                                   "dapo/kept_groups_total": 1.0}


def test_overlong_penalty_is_linear_over_the_buffer():
    data = batch(response_length=torch.tensor([1, 2, 3, 4]))
    out = call(ops.overlong_penalty, data, max_length=4, buffer=2, factor=1.0)
    assert set(out.keys()) == {"scores"}
    # expected length 2: lengths 3 and 4 lose 0.5 and 1.0
    torch.testing.assert_close(out["scores"], torch.tensor([1.0, 0.0, 0.5, 0.0]))
    assert out.meta["metrics"]["dapo/overlong_frac"] == pytest.approx(0.5)
    assert out.meta["metrics"]["critic/rewards/mean"] == pytest.approx(1.5 / 4)  # penalised
