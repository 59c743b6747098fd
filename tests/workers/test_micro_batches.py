"""Token-budget micro-batches: the split, the trimming, and that log-probs, values and
an update step are the same as with row micro-batches."""
import pytest
import torch

from tests.support.workers import make_cfg, ragged_responses, rollout_for_update
from hybridflow.workers import ActorWorker, CriticWorker
from hybridflow.workers.micro_batches import micro_batches, row_extents

RESPONSE_LENGTHS = [6, 1, 2, 6, 3, 1, 5, 2]  # ragged, as sampling makes them


@pytest.fixture(scope="module")
def rollout():
    actor = ActorWorker(make_cfg())
    batch = rollout_for_update(actor, n=2)
    return ragged_responses(batch, RESPONSE_LENGTHS, actor.tokenizer.pad_token_id)


def test_without_a_budget_micro_batches_are_row_slices(rollout):
    micros = micro_batches(rollout, 3)
    assert [m.index.tolist() for m in micros] == [[0, 1, 2], [3, 4, 5], [6, 7]]
    assert torch.equal(micros[1].batch["input_ids"], rollout["input_ids"][3:6])


def test_budget_groups_long_rows_together_within_budget_and_trims(rollout):
    prompt_len, response_len = row_extents(rollout)
    assert response_len.tolist() == RESPONSE_LENGTHS
    budget = 3 * int((prompt_len + response_len).max())
    micros = micro_batches(rollout, 2, budget)
    rows = torch.cat([m.index for m in micros])
    assert sorted(rows.tolist()) == list(range(len(rollout)))  # every row once
    lengths = (prompt_len + response_len)[rows]
    assert lengths.tolist() == sorted(lengths.tolist(), reverse=True)  # longest first
    assert len(micros) < len(rollout) / 2  # short rows share a micro-batch
    assert max(len(m.index) for m in micros) > 3  # more short rows than long ones
    for m in micros:
        width = m.batch["input_ids"].shape[1]
        assert len(m.index) == 1 or len(m.index) * width <= budget
        assert width == int(prompt_len[m.index].max() + response_len[m.index].max())
        assert m.batch["responses"].shape[1] == int(response_len[m.index].max())
        # nothing attended is dropped
        assert m.batch["attention_mask"].sum() == rollout["attention_mask"][m.index].sum()
    again = micro_batches(rollout, 2, budget)
    assert [m.index.tolist() for m in again] == [m.index.tolist() for m in micros]


def test_a_row_over_the_budget_runs_alone(rollout):
    micros = micro_batches(rollout, 2, 1)
    assert [len(m.index) for m in micros] == [1] * len(rollout)


def test_logprob_under_a_budget_matches_row_micro_batches(rollout):
    actor = ActorWorker(make_cfg())
    rows = actor.logprob(rollout, micro_batch_size=2, with_entropy=True)
    budget = actor.logprob(rollout, micro_batch_size=2, with_entropy=True,
                           max_tokens_per_micro_batch=24)
    mask = rollout["response_mask"].bool()
    torch.testing.assert_close(budget["old_log_probs"][mask], rows["old_log_probs"][mask],
                               rtol=0, atol=1e-6)
    assert (budget["old_log_probs"][~mask] == 0).any()  # columns trimmed away hold 0
    entropy = "actor/entropy"
    assert budget.meta["metrics"][entropy] == pytest.approx(rows.meta["metrics"][entropy],
                                                            abs=1e-6)


def test_values_under_a_budget_match_row_micro_batches(rollout):
    critic = CriticWorker(make_cfg())
    rows = critic.values(rollout, micro_batch_size=2)["values"]
    budget = critic.values(rollout, micro_batch_size=2, max_tokens_per_micro_batch=24)["values"]
    torch.testing.assert_close(budget, rows, rtol=0, atol=1e-6)


def one_update(rollout, agg_mode: str, budget):
    """Gradients at the optimizer step and the weights after it, and forward widths."""
    actor = ActorWorker(make_cfg(actor={"max_tokens_per_micro_batch": budget,
                                        "loss_agg_mode": agg_mode, "mini_batch_size": 8}))
    grads, widths = [], []
    actor.trainer.optimizer.register_step_pre_hook(lambda opt, args, kwargs: grads.extend(
        p.grad.clone() for p in actor.module.parameters() if p.grad is not None))
    actor.module.register_forward_hook(lambda mod, args, kw, out: widths.append(
        kw["input_ids"].shape[1]), with_kwargs=True)
    actor.update(rollout)
    return grads, [p.detach().clone() for p in actor.module.parameters()], widths


@pytest.mark.parametrize("agg_mode", ["token-mean", "seq-mean-token-mean"])
def test_update_under_a_budget_makes_the_row_micro_batches_update(rollout, agg_mode):
    grads_rows, weights_rows, widths_rows = one_update(rollout, agg_mode, None)
    grads_budget, weights_budget, widths_budget = one_update(rollout, agg_mode, 24)
    assert len(widths_rows) == 4 and set(widths_rows) == {rollout["input_ids"].shape[1]}
    assert min(widths_budget) < rollout["input_ids"].shape[1]  # padding not computed
    assert len(grads_rows) == len(grads_budget) > 0
    for a, b in zip(grads_rows, grads_budget):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-7)
    for a, b in zip(weights_rows, weights_budget):
        torch.testing.assert_close(b, a, rtol=0, atol=1e-6)
    assert any(not torch.equal(a, b) for a, b in
               zip(weights_rows, ActorWorker(make_cfg()).module.parameters()))  # it moved


def test_a_budget_below_one_token_is_refused_before_launch():
    from hybridflow.program.config import ConfigError, build_config
    with pytest.raises(ConfigError, match="actor.max_tokens_per_micro_batch"):
        build_config(overrides=["actor.max_tokens_per_micro_batch=0"])
    cfg = build_config(overrides=["critic.max_tokens_per_micro_batch=4096"])
    assert cfg.critic.max_tokens_per_micro_batch == 4096
    assert build_config().ref.max_tokens_per_micro_batch is None  # off by default
