"""Agent batches train on the model's tokens only: with a `loss_mask` over the
responses, the update, the advantages, the KL and the log-prob metrics ignore the
environment's observation tokens; without one they use `response_mask` as before."""
import torch

from graphs import ops
from hybridflow.core.batch import Batch
from hybridflow.workers import ActorWorker
from hybridflow.workers.sequences import training_mask_key
from tests.support.workers import make_cfg, rollout_for_update

CFG = dict(actor={"lr": 1e-2, "mini_batch_size": 8, "micro_batch_size": 4, "ppo_epochs": 1,
                  "use_kl_loss": True, "kl_loss_coef": 0.5, "entropy_coeff": 0.01})


def agent_like(batch: Batch) -> Batch:
    """The rollout with its last two real response tokens turned into an observation
    (loss_mask 0, response_mask still 1), as an agent episode ending on a tool result."""
    out = batch.take(torch.arange(len(batch)))
    mask = out["response_mask"].clone()
    last = mask.sum(-1) - 1
    for i, end in enumerate(last.tolist()):
        mask[i, max(0, end - 1):end + 1] = 0
    out["loss_mask"] = mask
    return out


def with_garbage(batch: Batch, seed: int) -> Batch:
    """Different garbage wherever loss_mask is 0 but attention is 1: the observation's
    token ids and every per-token value the losses read there."""
    gen = torch.Generator().manual_seed(seed)
    out = batch.take(torch.arange(len(batch)))
    hidden = (out["response_mask"] == 1) & (out["loss_mask"] == 0)
    width = out["responses"].shape[1]
    noise = lambda: torch.randn(out["responses"].shape, generator=gen) * 50  # noqa: E731
    for key in ("old_log_probs", "advantages", "ref_log_prob", "rollout_log_probs"):
        out[key] = torch.where(hidden, -noise().abs() if "log_prob" in key else noise(),
                               out[key])
    ids = torch.randint(3, 20, out["responses"].shape, generator=gen)
    out["responses"] = torch.where(hidden, ids, out["responses"])
    out["input_ids"] = torch.cat([out["input_ids"][:, :-width], out["responses"]], 1)
    return out


def updated_weights(batch: Batch) -> tuple[dict, dict]:
    actor = ActorWorker(make_cfg(**CFG))  # same seed: same initial weights
    metrics = actor.update(batch, loss=ops.policy_loss(actor.actor_cfg)).meta["metrics"]
    return {k: v.detach().clone() for k, v in actor.module.state_dict().items()}, metrics


def rollout() -> Batch:
    return agent_like(rollout_for_update(ActorWorker(make_cfg(**CFG))))


def test_the_training_mask_is_the_loss_mask_of_the_responses_width():
    r = torch.ones(2, 3, dtype=torch.long)
    assert training_mask_key(Batch({"responses": r, "response_mask": r})) == "response_mask"
    assert training_mask_key(Batch({"responses": r, "response_mask": r,
                                    "loss_mask": r})) == "loss_mask"
    # actor.sft's loss_mask spans [prompt | response]: not a response mask
    assert training_mask_key(Batch({"responses": r, "response_mask": r,
                                    "loss_mask": torch.ones(2, 5)})) == "response_mask"


def test_the_update_is_independent_of_the_tokens_the_loss_mask_hides():
    batch = rollout()
    a, metrics_a = updated_weights(with_garbage(batch, 1))
    b, metrics_b = updated_weights(with_garbage(batch, 2))
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=0, atol=1e-6, msg=name)
    for key in ("actor/pg_loss", "actor/kl_loss", "actor/entropy"):
        assert abs(metrics_a[key] - metrics_b[key]) < 1e-5, key


def test_without_a_loss_mask_the_same_garbage_changes_the_update():
    batch = rollout()
    keys = [k for k in batch.keys() if k != "loss_mask"]
    first, second = with_garbage(batch, 1).select(*keys), with_garbage(batch, 2).select(*keys)
    a, _ = updated_weights(first)
    b, _ = updated_weights(second)
    assert any(not torch.allclose(a[n], b[n], atol=1e-6) for n in a)


def test_group_advantages_are_zero_on_observation_tokens():
    mask = torch.tensor([[1, 1, 0, 0, 1], [1, 0, 0, 1, 1]])
    batch = Batch({"scores": torch.tensor([1.0, 0.0]), "response_mask": torch.ones(2, 5),
                   "loss_mask": mask, "responses": torch.zeros(2, 5, dtype=torch.long)},
                  {"uid": ["a", "a"]})
    adv = ops.grpo_advantages(batch)["advantages"]
    assert torch.all(adv[mask == 0] == 0) and torch.all(adv[mask == 1] != 0)


def test_kl_in_reward_counts_model_tokens_only():
    mask = torch.tensor([[1, 0, 1]])
    batch = Batch({"token_level_scores": torch.zeros(1, 3), "response_mask": torch.ones(1, 3),
                   "loss_mask": mask, "responses": torch.zeros(1, 3, dtype=torch.long),
                   "old_log_probs": torch.tensor([[-1.0, -9.0, -1.0]]),
                   "ref_log_prob": torch.tensor([[-2.0, 0.0, -2.0]])})
    rewards = ops.KLInReward("k1", beta=1.0)(batch)["token_level_rewards"]
    assert rewards[0, 1] == 0 and rewards[0, 0] == -1.0


def test_logprob_metrics_read_model_tokens_only():
    actor = ActorWorker(make_cfg(**CFG))
    batch = rollout()
    a, b = (actor.logprob(with_garbage(batch, seed), with_entropy=True).meta["metrics"]
            for seed in (1, 2))
    assert a["rollout/probs_diff_max"] == b["rollout/probs_diff_max"]
    assert abs(a["actor/entropy"] - b["actor/entropy"]) < 1e-6


def critic_updated(batch: Batch) -> tuple[dict, dict]:
    from hybridflow.workers import CriticWorker
    critic = CriticWorker(make_cfg(critic={"lr": 1e-2, "mini_batch_size": 8,
                                           "micro_batch_size": 4, "ppo_epochs": 1}))
    batch = batch.take(torch.arange(len(batch)))
    batch["values"] = critic.values(batch)["values"]
    metrics = critic.update(batch, loss=ops.critic_value_loss(critic.critic_cfg)).meta["metrics"]
    return {k: v.detach().clone() for k, v in critic.module.state_dict().items()}, metrics


def test_the_critic_update_is_independent_of_the_tokens_the_loss_mask_hides():
    batch = rollout()
    batch["returns"] = batch["advantages"].clone()
    first, second = with_garbage(batch, 1), with_garbage(batch, 2)
    hidden = (batch["response_mask"] == 1) & (batch["loss_mask"] == 0)
    second["returns"] = torch.where(hidden, first["returns"] * -7 + 3, first["returns"])
    a, metrics_a = critic_updated(first)
    b, metrics_b = critic_updated(second)
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=0, atol=1e-6, msg=name)
    assert abs(metrics_a["critic/vf_loss"] - metrics_b["critic/vf_loss"]) < 1e-5
