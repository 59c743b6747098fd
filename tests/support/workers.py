"""Helpers of the worker tests: a tiny model config and toy prompt batches."""
import numpy as np
import torch

from hybridflow.core.batch import Batch

torch.set_num_threads(1)

TINY = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "model_type": "llama",
        "max_position_embeddings": 128, "tie_word_embeddings": False}


def make_cfg(**sections) -> dict:
    cfg = {"model": {"hf_config": dict(TINY), "device": "cpu"},
           "actor": {"lr": 1e-3, "mini_batch_size": 8, "micro_batch_size": 2},
           "rollout": {"max_new_tokens": 6}, "critic": {}, "ref": {}, "reward": {}}
    for name, values in sections.items():
        cfg[name] = {**cfg.get(name, {}), **values}
    return cfg


def prompt_batch(tokenizer, texts, answers=None) -> Batch:
    enc = tokenizer(list(texts), padding=True, return_tensors="pt")
    answers = answers or [str(eval(t.rstrip("="))) for t in texts]
    return Batch({"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"]},
                 {"uid": [f"u{i}" for i in range(len(texts))],
                  "data_source": ["toy_arith"] * len(texts), "ground_truth": answers})


def empty_like(batch: Batch) -> Batch:
    return batch.take(np.arange(0))


PROMPTS = ["1+2=", "10+20=", "7*8=", "99-1="]


def rollout_for_update(actor, prompts=PROMPTS, n=2, seed=0) -> Batch:
    """A generated batch with log-probs, random advantages and a nearby reference.
    Here, not in a test module, so that processes spawned for data-parallel ranks
    import it by its full name and no test imports another."""
    torch.manual_seed(seed)
    out = actor.generate(prompt_batch(actor.tokenizer, prompts), n=n)
    out = out.union(actor.logprob(out))
    gen = torch.Generator().manual_seed(seed)
    out["advantages"] = torch.randn(out["responses"].shape, generator=gen)
    out["ref_log_prob"] = out["old_log_probs"] + 0.1 * torch.randn(
        out["responses"].shape, generator=gen)
    return out


def odd_width(batch: Batch) -> Batch:
    """`batch` with one column fewer where its row width is even, so that a
    sequence-parallel split over 2 ranks has to pad the row."""
    width, resp = batch["input_ids"].shape[1], batch["responses"].shape[1]
    if width % 2:
        return batch
    out = batch.select(*batch.keys())
    for key in batch.keys():
        value = batch[key]
        if torch.is_tensor(value) and value.dim() >= 2 and value.shape[1] in (width, resp):
            out[key] = value[:, :-1].contiguous()
    return out


def long_prompt(batch: Batch, pad: int = 8) -> Batch:
    """`batch` with `pad` more left-padding columns (attended by no one): at sp=2 the
    first rank's slice of the row then predicts no response token."""
    out = batch.select(*batch.keys())
    width = batch["input_ids"].shape[1]
    for key in ("input_ids", "attention_mask", "position_ids"):
        value = batch[key]
        assert value.shape[1] == width, key
        out[key] = torch.cat([value.new_zeros((len(batch), pad)), value], 1)
    return out


def ragged_responses(batch: Batch, lengths, pad_id: int) -> Batch:
    """`batch` with each row's response cut to `lengths` (padded and masked after), as
    sampling makes them: long-tailed, not all `max_new_tokens`."""
    width = batch["responses"].shape[1]
    keep = torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]
    batch["responses"] = torch.where(keep, batch["responses"], pad_id)
    batch["response_mask"] = keep.long()
    batch["input_ids"][:, -width:] = batch["responses"]
    batch["attention_mask"][:, -width:] = keep.long()
    return batch


def leave_process_group(rank: int, out_dir: str, timeout_s: float = 120.0) -> None:
    """Tear the process group down with rank 0 (the host of its TCP store) leaving last.
    A rank whose teardown still talks to the store waits for the store's default
    timeout (30 min) when rank 0 has already exited: that hung the 2-rank tests."""
    import os
    import time

    import torch.distributed as dist
    dist.barrier()
    if rank != 0:
        dist.destroy_process_group()
        open(os.path.join(out_dir, f"left{rank}"), "w").close()
        return
    others = [os.path.join(out_dir, f"left{r}") for r in range(1, dist.get_world_size())]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and not all(os.path.exists(p) for p in others):
        time.sleep(0.05)
    dist.destroy_process_group()


QWEN2 = {**TINY, "model_type": "qwen2", "rope_theta": 10000.0}
MODELS = {"llama": TINY, "qwen2": QWEN2}  # the tiny architectures packed tests cover


def packed_cfg(model_type: str, packed: bool, **sections) -> dict:
    """A worker config on a tiny `model_type` model, packed sequences on or off."""
    cfg = make_cfg(**sections)
    cfg["model"] = {**cfg["model"], "hf_config": dict(MODELS[model_type]),
                    "use_remove_padding": packed}
    return cfg


def ragged_rollout(lengths) -> Batch:
    """A rollout of the tiny actor whose responses end at `lengths` (ragged)."""
    from hybridflow.workers import ActorWorker
    actor = ActorWorker(make_cfg())
    batch = rollout_for_update(actor, n=2)
    return ragged_responses(batch, lengths, actor.tokenizer.pad_token_id)


# Weights after one AdamW step, sharded vs one rank: the first step is lr * g / (|g| + eps),
# so a gradient entry within float32 noise of eps moves its weight by a visible fraction
# of lr on that noise alone (the gradients themselves are compared to 1e-5). Measured:
# up to 1.3e-5 at lr 1e-3 on the toy's batches; a wrongly sharded weight is off by ~lr.
ADAM_STEP_ATOL = 3e-5
