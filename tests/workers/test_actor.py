"""ActorWorker on a tiny Llama: generate, logprob, update, sft, checkpoints, empty batches."""
import numpy as np
import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from tests.support.workers import (PROMPTS, empty_like, make_cfg, prompt_batch,
                                   rollout_for_update)
from hybridflow.core.batch import Batch
from hybridflow.workers import ActorWorker
from hybridflow.workers.base import held_bytes



def greedy(actor, batch, **kw):
    return actor.generate(batch, n=1, do_sample=False, **kw)


def test_generate_repeats_rows_interleaved_and_forwards_columns(actor_module):
    batch = prompt_batch(actor_module.tokenizer, PROMPTS)
    torch.manual_seed(0)
    out = actor_module.generate(batch, n=3, max_new_tokens=5)
    assert len(out) == 12
    assert list(out["uid"]) == [u for u in batch["uid"] for _ in range(3)]
    assert list(out["ground_truth"][:3]) == ["3"] * 3
    assert out["responses"].shape == (12, 5) and out["response_length"].max() <= 5
    assert torch.equal(out["prompts"], batch["input_ids"].repeat_interleave(3, 0))
    assert torch.equal(out["input_ids"], torch.cat([out["prompts"], out["responses"]], 1))
    assert torch.equal(out["attention_mask"][:, -5:], out["response_mask"])
    assert "rollout/weight_sync_s" in out.meta["metrics"]


def test_generate_left_padding_does_not_change_a_prompt_answer(actor_module):
    tok = actor_module.tokenizer
    together = greedy(actor_module, prompt_batch(tok, ["1+2=", "123+456="]))
    alone = greedy(actor_module, prompt_batch(tok, ["1+2="]))
    assert together["input_ids"][0, 0] == tok.pad_token_id  # really left-padded
    assert torch.equal(together["responses"][0], alone["responses"][0])


def test_generate_stops_at_eos_and_masks_after_it(cfg):
    actor = ActorWorker(cfg)
    batch = prompt_batch(actor.tokenizer, PROMPTS)
    before = greedy(actor, batch)["responses"]
    eos_id = int(before[0, 2])  # make the token greedy emits third in row 0 the EOS
    actor.tokenizer.eos_token = actor.tokenizer.convert_ids_to_tokens(eos_id)
    after = greedy(actor, batch)
    pad = actor.tokenizer.pad_token_id
    for row in range(len(PROMPTS)):
        hits = (before[row] == eos_id).nonzero()
        stop = int(hits[0]) + 1 if len(hits) else before.shape[1]
        assert after["response_length"][row] == stop
        assert torch.equal(after["responses"][row, :stop], before[row, :stop])
        assert (after["responses"][row, stop:] == pad).all()
        assert after["response_mask"][row].tolist() == [1] * stop + [0] * (6 - stop)
    assert after["response_length"][0] <= 3


def test_generate_honours_max_new_tokens_without_eos(actor_module):
    out = actor_module.generate(prompt_batch(actor_module.tokenizer, PROMPTS), n=2,
                                max_new_tokens=3, do_sample=True, temperature=0.7)
    assert out["responses"].shape[1] == 3 and out["input_ids"].shape[1] == 3 + 6


@pytest.mark.parametrize("temperature", [1.0, 2.0])
def test_logprob_equals_manual_log_softmax_gather(actor_module, temperature):
    out = actor_module.generate(prompt_batch(actor_module.tokenizer, PROMPTS), n=2)
    got = actor_module.logprob(out, micro_batch_size=3, temperature=temperature,
                               with_entropy=True)
    with torch.no_grad():
        logits = actor_module.module(input_ids=out["input_ids"],
                                     attention_mask=out["attention_mask"],
                                     position_ids=out["position_ids"]).logits
    width = out["responses"].shape[1]
    logp = torch.log_softmax(logits[:, -width - 1:-1] / temperature, -1)
    manual = logp.gather(-1, out["responses"].unsqueeze(-1)).squeeze(-1)
    assert torch.allclose(got["old_log_probs"], manual, atol=1e-5)
    assert got.keys() == ["old_log_probs"] and got.meta["metrics"]["actor/entropy"] > 0


def test_update_reports_verl_metrics_and_changes_weights():
    actor = ActorWorker(make_cfg(actor={"use_kl_loss": True, "entropy_coeff": 0.01,
                                        "ppo_epochs": 2}))
    data = rollout_for_update(actor)
    before = [p.detach().clone() for p in actor.module.parameters()]
    out = actor.update(data)
    metrics = out.meta["metrics"]
    for key in ("actor/pg_loss", "actor/pg_clipfrac", "actor/ppo_kl", "actor/kl_loss",
                "actor/entropy", "actor/grad_norm", "actor/lr"):
        assert key in metrics and np.isfinite(metrics[key]), key
    assert len(out) == 0 and out.keys() == []
    assert any(not torch.equal(a, b) for a, b in zip(before, actor.module.parameters()))


def test_kl_loss_without_ref_log_prob_is_a_clear_error():
    actor = ActorWorker(make_cfg(actor={"use_kl_loss": True}))
    data = rollout_for_update(actor).drop("ref_log_prob")
    with pytest.raises(KeyError, match="ref_log_prob"):
        actor.update(data)


def test_colocated_rollout_generates_with_the_updated_weights():
    actor = ActorWorker(make_cfg(actor={"lr": 0.05}))
    prompts = prompt_batch(actor.tokenizer, PROMPTS)
    first = greedy(actor, prompts)
    assert actor.rollout.module is actor.module  # same object: no copy to make
    actor.update(rollout_for_update(actor))
    second = greedy(actor, prompts)
    assert not torch.equal(first["responses"], second["responses"])
    fresh = AutoModelForCausalLM.from_config(actor.module.config)
    fresh.load_state_dict(actor.module.state_dict())
    fresh.eval()
    seqs = fresh.generate(input_ids=prompts["input_ids"], attention_mask=prompts["attention_mask"],
                          position_ids=second["position_ids"][:, :6], do_sample=False,
                          max_new_tokens=6, pad_token_id=actor.tokenizer.pad_token_id,
                          eos_token_id=actor.tokenizer.eos_token_id)
    expected = torch.where(second["response_mask"].bool(), seqs[:, 6:],
                           actor.tokenizer.pad_token_id)
    assert torch.equal(second["responses"], expected)
    assert greedy(actor, prompts).meta["metrics"]["rollout/weight_sync_s"] < 0.01


def test_sft_lowers_the_loss_on_its_targets():
    actor = ActorWorker(make_cfg(actor={"lr": 1e-2}))
    enc = actor.tokenizer(["1+2=3", "4+4=8"], padding=True, return_tensors="pt")
    mask = enc["attention_mask"]
    loss_mask = torch.zeros_like(mask)
    loss_mask[:, -1] = 1  # only the answer digit
    batch = Batch({"input_ids": enc["input_ids"], "attention_mask": mask,
                   "position_ids": (mask.cumsum(-1) - 1).clamp(min=0), "loss_mask": loss_mask})
    losses = [actor.sft(batch).meta["metrics"]["actor/sft_loss"] for _ in range(10)]
    assert losses[-1] < losses[0] * 0.5


def test_every_method_accepts_an_empty_batch(actor_module):
    data = rollout_for_update(actor_module)
    empty = empty_like(data)
    gen = actor_module.generate(empty_like(prompt_batch(actor_module.tokenizer, PROMPTS)), n=2)
    assert len(gen) == 0 and gen["responses"].shape == (0, 6)
    assert actor_module.logprob(empty)["old_log_probs"].shape == (0, 6)
    before = [p.detach().clone() for p in actor_module.module.parameters()]
    assert len(actor_module.update(empty)) == 0  # one rank alone: no rows, no step
    assert all(torch.equal(a, b) for a, b in zip(before, actor_module.module.parameters()))


def test_checkpoint_round_trip_restores_weights_and_optimizer(tmp_path):
    actor = ActorWorker(make_cfg())
    data = rollout_for_update(actor)
    actor.update(data)
    actor.save_checkpoint(str(tmp_path))
    saved = {k: v.clone() for k, v in actor.module.state_dict().items()}
    step = actor.trainer.scheduler.last_epoch
    actor.update(data)
    actor.load_checkpoint(str(tmp_path))
    assert all(torch.equal(saved[k], v) for k, v in actor.module.state_dict().items())
    assert actor.trainer.scheduler.last_epoch == step
    # the weights are DCP shards (hybridflow export makes them a model); the config is HF's
    assert AutoConfig.from_pretrained(tmp_path).hidden_size == 32
    assert held_bytes([actor.held_tensors()])["engine/weight_bytes"] == sum(
        p.numel() * 4 for p in actor.module.parameters()) \
        + sum(b.numel() * b.element_size() for b in actor.module.buffers())
