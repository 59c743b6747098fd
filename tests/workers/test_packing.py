"""Packed sequences (`model.use_remove_padding`): a micro-batch runs as one row of its
real tokens, and log-probs, entropy, values and an update's gradients are those of
the padded forward, on Llama and Qwen2, with ragged lengths."""
import pytest
import torch

from tests.support.workers import packed_cfg, ragged_rollout
from hybridflow.core.batch import Batch
from hybridflow.workers import ActorWorker, CriticWorker
from hybridflow.workers.micro_batches import micro_batches, row_extents
from hybridflow.workers.packing import PackedRows

RESPONSE_LENGTHS = [6, 1, 2, 6, 3, 1, 5, 2]  # ragged, as sampling makes them


@pytest.fixture(scope="module")
def rollout():
    return ragged_rollout(RESPONSE_LENGTHS)


def test_packed_rows_hold_only_real_tokens_with_restarting_positions(rollout):
    micro = rollout.take(slice(0, 3))
    packed = PackedRows(micro)
    attended = micro["attention_mask"].bool()
    assert len(packed) == int(attended.sum())  # no pad token is computed
    assert torch.equal(packed.input_ids[0], micro["input_ids"][attended])
    starts = (packed.position_ids[0] == 0).nonzero().flatten().tolist()
    lengths = attended.sum(dim=1).tolist()
    assert starts == [0, lengths[0], lengths[0] + lengths[1]]  # restart at every row
    # one kept position per attended response token, predicting exactly that token
    assert len(packed.keep) == int(micro["response_mask"].sum())
    assert torch.equal(packed.input_ids[0, packed.keep + 1], packed.tokens)
    values = torch.arange(1, len(packed.keep) + 1, dtype=torch.float32)
    out = packed.unpack(values)
    assert out.shape == micro["responses"].shape
    assert torch.equal(out != 0, micro["response_mask"].bool())


@pytest.mark.parametrize("model_type", ["llama", "qwen2"])
def test_packed_logprobs_and_entropy_match_padded(rollout, model_type):
    padded = ActorWorker(packed_cfg(model_type, False)).logprob(rollout, micro_batch_size=4,
                                                              with_entropy=True)
    packed = ActorWorker(packed_cfg(model_type, True)).logprob(rollout, micro_batch_size=4,
                                                             with_entropy=True)
    mask = rollout["response_mask"].bool()
    torch.testing.assert_close(packed["old_log_probs"][mask], padded["old_log_probs"][mask],
                               rtol=0, atol=1e-5)
    assert (packed["old_log_probs"][~mask] == 0).all()  # pads are not computed: 0
    entropy = "actor/entropy"
    assert packed.meta["metrics"][entropy] == pytest.approx(
        padded.meta["metrics"][entropy], abs=1e-5)


def test_packed_rows_do_not_attend_to_each_other(rollout):
    actor = ActorWorker(packed_cfg("qwen2", True))
    before = actor.logprob(rollout, micro_batch_size=8)["old_log_probs"]
    changed = rollout.take(slice(0, len(rollout)))
    attended = changed["attention_mask"][0].bool()
    changed["input_ids"][0, attended] = (changed["input_ids"][0, attended] + 1) % 10 + 3
    after = actor.logprob(changed, micro_batch_size=8)["old_log_probs"]
    assert not torch.equal(after[0], before[0])  # row 0 did change
    torch.testing.assert_close(after[1:], before[1:], rtol=0, atol=0)


@pytest.mark.parametrize("model_type", ["llama", "qwen2"])
def test_packed_values_match_padded(rollout, model_type):
    padded = CriticWorker(packed_cfg(model_type, False)).values(rollout, micro_batch_size=4)
    packed = CriticWorker(packed_cfg(model_type, True)).values(rollout, micro_batch_size=4)
    torch.testing.assert_close(packed["values"], padded["values"], rtol=0, atol=1e-5)


def test_packed_reference_logprobs_match_padded(rollout):
    from hybridflow.workers import ReferenceWorker
    padded = ReferenceWorker(packed_cfg("llama", False)).logprob(rollout, micro_batch_size=3)
    packed = ReferenceWorker(packed_cfg("llama", True)).logprob(rollout, micro_batch_size=3)
    mask = rollout["response_mask"].bool()
    torch.testing.assert_close(packed["ref_log_prob"][mask], padded["ref_log_prob"][mask],
                               rtol=0, atol=1e-5)


def actor_update(rollout, model_type: str, packed: bool, agg_mode: str, budget=None):
    """Gradients at the optimizer step, the weights after it, the update's metrics and
    each forward's input width."""
    actor = ActorWorker(packed_cfg(model_type, packed, actor={
        "loss_agg_mode": agg_mode, "mini_batch_size": 8, "max_tokens_per_micro_batch": budget,
        "entropy_coeff": 0.01}))
    grads, widths = [], []
    actor.trainer.optimizer.register_step_pre_hook(lambda opt, args, kwargs: grads.extend(
        p.grad.clone() for p in actor.module.parameters() if p.grad is not None))
    actor.module.register_forward_hook(lambda mod, args, kw, out: widths.append(
        kw["input_ids"].shape), with_kwargs=True)
    metrics = actor.update(rollout).meta["metrics"]
    return grads, [p.detach().clone() for p in actor.module.parameters()], metrics, widths


@pytest.mark.parametrize("model_type,agg_mode", [("llama", "token-mean"),
                                                 ("qwen2", "seq-mean-token-mean")])
def test_packed_update_makes_the_padded_update(rollout, model_type, agg_mode):
    grads_pad, weights_pad, metrics_pad, shapes_pad = actor_update(
        rollout, model_type, False, agg_mode)
    grads_pack, weights_pack, metrics_pack, shapes_pack = actor_update(
        rollout, model_type, True, agg_mode)
    assert all(shape[0] == 1 for shape in shapes_pack)  # one packed row a micro-batch
    assert sum(s[1] for s in shapes_pack) == int(rollout["attention_mask"].sum())
    assert len(grads_pad) == len(grads_pack) > 0
    for a, b in zip(grads_pad, grads_pack):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-5)
    for a, b in zip(weights_pad, weights_pack):
        torch.testing.assert_close(b, a, rtol=0, atol=1e-5)
    # the loss normalisation is unchanged: the same loss value and metrics
    for key in ("actor/pg_loss", "actor/entropy", "actor/grad_norm"):
        assert metrics_pack[key] == pytest.approx(metrics_pad[key], abs=1e-5)


def test_packed_update_under_a_real_token_budget_makes_the_padded_update(rollout):
    grads_pad, _, _, _ = actor_update(rollout, "llama", False, "token-mean")
    budget = 40  # real tokens: a few rows a micro-batch
    grads_pack, _, _, shapes = actor_update(rollout, "llama", True, "token-mean", budget)
    prompt_len, response_len = row_extents(rollout)
    assert max(s[1] for s in shapes) <= max(budget, int((prompt_len + response_len).max()))
    assert len(shapes) > 1
    for a, b in zip(grads_pad, grads_pack):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-5)


def test_packed_critic_update_makes_the_padded_update(rollout):
    data = rollout.update(Batch({"values": torch.zeros(rollout["responses"].shape),
                                 "returns": torch.randn(rollout["responses"].shape)}))
    weights = {}
    for packed in (False, True):
        critic = CriticWorker(packed_cfg("qwen2", packed, critic={"mini_batch_size": 8,
                                                                "micro_batch_size": 3}))
        critic.update(data)
        weights[packed] = [p.detach().clone() for p in critic.module.parameters()]
    for a, b in zip(weights[False], weights[True]):
        torch.testing.assert_close(b, a, rtol=0, atol=1e-5)


def test_a_packed_budget_counts_real_tokens(rollout):
    prompt_len, response_len = row_extents(rollout)
    lengths = prompt_len + response_len
    budget = int(lengths.max()) * 2
    packed = micro_batches(rollout, 2, budget, packed=True)
    padded = micro_batches(rollout, 2, budget)
    for m in packed:
        assert len(m.index) == 1 or int(lengths[m.index].sum()) <= budget
    assert len(packed) <= len(padded)  # real tokens fill a budget more than padded ones


def test_position_ids_that_do_not_restart_are_refused(rollout):
    micro = rollout.take(slice(0, 2))
    attended = micro["attention_mask"].bool()
    shifted = micro["position_ids"].clone()
    shifted[1] = shifted[1] + int(attended[0].sum())  # row 1 continues row 0
    micro["position_ids"] = shifted
    with pytest.raises(ValueError, match="use_remove_padding"):
        PackedRows(micro)


def test_remove_padding_is_off_by_default_and_settable():
    from hybridflow.program.config import build_config
    assert build_config().model.use_remove_padding is False
    assert build_config(overrides=["model.use_remove_padding=true"]).model.use_remove_padding



def test_packed_logprobs_under_eager_attention_match_padded(rollout):
    results = []
    for packed in (False, True):
        cfg = packed_cfg("qwen2", packed)
        cfg["model"]["hf_config"]["attn_implementation"] = "eager"  # dense block mask
        results.append(ActorWorker(cfg).logprob(rollout, micro_batch_size=8)["old_log_probs"])
    mask = rollout["response_mask"].bool()
    torch.testing.assert_close(results[1][mask], results[0][mask], rtol=0, atol=1e-5)


def test_packed_lora_update_makes_the_padded_update(rollout):
    weights = {}
    for packed in (False, True):
        actor = ActorWorker(packed_cfg("qwen2", packed, actor={"mini_batch_size": 8,
                                                             "lora": {"rank": 4}}))
        old = actor.logprob(rollout)["old_log_probs"]
        actor.update(rollout.update(Batch({"old_log_probs": old})))
        weights[packed] = [p.detach().clone() for p in actor.module.parameters()
                           if p.requires_grad]
    assert weights[True] and any(w.abs().max() > 0 for w in weights[True])
    for a, b in zip(weights[False], weights[True]):
        torch.testing.assert_close(b, a, rtol=0, atol=1e-5)


def test_packed_bf16_logprobs_match_padded_to_bf16_rounding(rollout):
    results = []
    for packed in (False, True):
        cfg = packed_cfg("qwen2", packed)
        cfg["model"]["dtype"] = "bfloat16"
        actor = ActorWorker(cfg)
        results.append(actor.logprob(rollout, micro_batch_size=4)["old_log_probs"])
        actor.update(rollout.update(Batch({"old_log_probs": results[-1]})))  # it trains
    mask = rollout["response_mask"].bool()
    assert results[0][mask].abs().min() > 0.1  # real log-probs, not zeros
    torch.testing.assert_close(results[1][mask], results[0][mask], rtol=0, atol=5e-2)


def test_a_packed_micro_batch_without_response_tokens_still_backpropagates(rollout):
    from hybridflow.workers.packing import packed_logits
    actor = ActorWorker(packed_cfg("llama", True))
    micro = rollout.take(slice(0, 2))
    width = micro["responses"].shape[1]
    micro["attention_mask"][:, -width:] = 0  # responses empty: prompts only
    packed = PackedRows(micro)
    logits = packed_logits(actor.module, packed)
    assert logits.shape[0] == 0 and logits.requires_grad
    packed.unpack(token_logprobs_of(logits, packed)).sum().backward()  # no error


def token_logprobs_of(logits, packed):
    from hybridflow.workers.sequences import token_logprobs
    return token_logprobs(logits, packed.tokens)


def test_a_micro_batch_with_no_attended_token_is_refused_by_name(rollout):
    from hybridflow.workers.packing import packed_logits
    micro = rollout.take(slice(0, 1))
    micro["attention_mask"][:] = 0
    with pytest.raises(ValueError, match="no attended token"):
        packed_logits(ActorWorker(packed_cfg("llama", True)).module, PackedRows(micro))
