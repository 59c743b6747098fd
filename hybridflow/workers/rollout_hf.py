"""Rollout through Hugging Face `generate`, on CPU or GPU.

Colocated with the actor (the default), the engine *is* the actor's module: after
an update the next `generate` already uses the new weights, with no copy.
`sync_weights` then only times the hand-over (`rollout/weight_sync_s`, ~0). With a
separate module (a rollout engine of its own), `load_weights` copies a state dict
in, and `broadcast_weights` sends rank 0's weights to the group.

Output layout: prompts stay left-padded as given; responses are right-padded with
the pad token to exactly `max_new_tokens`, so shards from every rank concatenate.
"""
from __future__ import annotations

import time
from dataclasses import replace

import torch
import torch.distributed as dist

from hybridflow.batch import Batch
from hybridflow.workers.config import RolloutConfig
from hybridflow.workers.sequences import pad_right, position_ids_from_mask, \
    response_mask_from_ids

__all__ = ["HFRollout", "sampling_options", "assemble_rollout"]


def sampling_options(cfg: RolloutConfig, **overrides) -> RolloutConfig:
    """The rollout config with per-call overrides (None means keep the config's)."""
    given = {k: v for k, v in overrides.items() if v is not None}
    unknown = set(given) - set(RolloutConfig.__dataclass_fields__)
    if unknown:
        raise TypeError(f"unknown generate option(s) {sorted(unknown)}")
    opts = replace(cfg, **given)
    if opts.n < 1:
        raise ValueError(f"generate needs n >= 1, got n={opts.n}")
    if opts.max_new_tokens < 1:
        raise ValueError(f"generate needs max_new_tokens >= 1, got {opts.max_new_tokens}")
    if opts.do_sample and opts.temperature <= 0:
        raise ValueError(f"sampling needs temperature > 0, got {opts.temperature}; "
                         "use do_sample=False for greedy decoding")
    return opts


def assemble_rollout(prompts: Batch, responses: torch.Tensor, pad_id: int, eos_id) -> Batch:
    """The generate output columns from repeated prompts and [B, R] response ids."""
    prompt_ids, prompt_mask = prompts["input_ids"], prompts["attention_mask"]
    response_mask = response_mask_from_ids(responses, eos_id)
    responses = torch.where(response_mask.bool(), responses, torch.full_like(responses, pad_id))
    attention_mask = torch.cat([prompt_mask.long(), response_mask], dim=1)
    return Batch({
        "prompts": prompt_ids,
        "responses": responses,
        "response_mask": response_mask,
        "input_ids": torch.cat([prompt_ids, responses], dim=1),
        "attention_mask": attention_mask,
        "position_ids": position_ids_from_mask(attention_mask),
        "response_length": response_mask.sum(-1),
    })


class HFRollout:
    """HF `generate` on `module` (the actor's own module when colocated)."""

    def __init__(self, module: torch.nn.Module, tokenizer, cfg: RolloutConfig, device,
                 synced_gpus: bool = False):
        self.module, self.tokenizer, self.cfg, self.device = module, tokenizer, cfg, device
        self.synced_gpus = synced_gpus  # FSDP: every rank must run every decoding step
        self.last_sync_s = 0.0

    def sync_weights(self, source: torch.nn.Module | None = None) -> float:
        """Make the engine's weights current; returns (and stores) the seconds spent."""
        start = time.perf_counter()
        if source is not None and source is not self.module:
            self.load_weights(source.state_dict())
        self.last_sync_s = time.perf_counter() - start
        return self.last_sync_s

    def load_weights(self, state_dict: dict[str, torch.Tensor]) -> None:
        with torch.no_grad():
            self.module.load_state_dict(state_dict, strict=True)

    def broadcast_weights(self, src: int = 0) -> None:
        """Split pools: rank `src`'s weights to every rank of the default group."""
        if dist.is_available() and dist.is_initialized():
            with torch.no_grad():
                for tensor in self.module.state_dict().values():
                    dist.broadcast(tensor, src=src)

    def _generation_config(self, opts: RolloutConfig):
        from transformers import GenerationConfig
        sample = {"do_sample": True, "temperature": opts.temperature, "top_p": opts.top_p,
                  "top_k": opts.top_k if opts.top_k > 0 else 0} if opts.do_sample else \
            {"do_sample": False}
        return GenerationConfig(max_new_tokens=opts.max_new_tokens, min_new_tokens=0,
                                pad_token_id=self.tokenizer.pad_token_id,
                                eos_token_id=self.tokenizer.eos_token_id, use_cache=True,
                                **sample)

    @torch.no_grad()
    def generate(self, prompts: Batch, opts: RolloutConfig) -> Batch:
        """Rows of `prompts` already repeated n times; returns the rollout columns."""
        pad, eos = self.tokenizer.pad_token_id, self.tokenizer.eos_token_id
        width = opts.max_new_tokens
        if len(prompts) == 0 and not self.synced_gpus:
            return assemble_rollout(prompts, torch.zeros(0, width, dtype=torch.long), pad, eos)
        was_training = self.module.training
        self.module.eval()
        config = self._generation_config(opts)
        outs = []
        try:
            for i in range(0, max(1, len(prompts)), opts.micro_batch_size):
                micro = prompts.take(slice(i, i + opts.micro_batch_size))
                ids, mask = micro["input_ids"], micro["attention_mask"]
                if len(micro) == 0:  # synced FSDP rank with no rows: decode a dummy row
                    ids, mask = torch.full((1, 1), pad), torch.ones(1, 1, dtype=torch.long)
                seqs = self.module.generate(
                    input_ids=ids.to(self.device), attention_mask=mask.to(self.device),
                    position_ids=position_ids_from_mask(mask).to(self.device),
                    generation_config=config, synced_gpus=self.synced_gpus)
                if len(micro):
                    outs.append(pad_right(seqs[:, ids.shape[1]:].cpu(), width, pad))
        finally:
            self.module.train(was_training)
        responses = torch.cat(outs) if outs else torch.zeros(0, width, dtype=torch.long)
        return assemble_rollout(prompts, responses, pad, eos)
