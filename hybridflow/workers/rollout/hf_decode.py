"""The `hf` engine's own decode loop: what HF `generate` does for one batch, with the
per-step work a small batch on a CPU pays for cut out.

Profiled on SmolLM2-135M (32 rows, 48 new tokens, fp32, 2 threads; docs/benchmarks.md),
HF `generate` spends time beyond the model's matmuls on:
- sampling: `torch.multinomial` draws one exponential per vocabulary entry and row
  (32 x 49,152 a step, serially), as long as a third of the decode step's matmuls.
  `sample` draws one uniform per row and inverts the row's CDF (cumsum accumulates in
  float64 on the CPU, so each prefix is the exact sum rounded once): the same
  categorical distribution, another stream of draws for a given seed;
- rows that ended: they keep being decoded until every row has. `decode` drops them
  from the batch (and from the KV cache) once they are an eighth of it;
- the prefill's output head: `logits_to_keep=1` hands it a [B, 1, H] slice that
  `matmul` runs as a batched product over a copy of the head's weights per row;
  a [B, H] matrix runs as one matmul.

Greedy decoding picks the argmax of the same logits as before. Every token's
log-prob is read from the processed scores it was drawn from (the warpers applied),
as `ChosenLogProbs` does for HF `generate`.

State: none; `decode` is a function of the module, the batch and the global torch RNG.
The stream loop (stream.py) samples and reads log-probs with the same functions.
"""
from __future__ import annotations

import functools
import inspect
from contextlib import contextmanager

import torch

from hybridflow.workers.sequences import position_ids_from_mask

__all__ = ["decode", "sample", "processed_log_probs", "flat_head", "last_logits", "cache_key"]

COMPACT_SHARE = 8  # drop ended rows from the batch once they are 1/8 of it


def sample(logp: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """One token per row of log-probs [B, V] (-inf: never drawn), by inverting its CDF
    at one uniform draw of `generator` (the global torch RNG by default); [B] long."""
    cdf = logp.exp().cumsum(-1)            # float64 accumulation on the CPU
    total = cdf[:, -1:]
    u = torch.rand(total.shape, device=logp.device, dtype=cdf.dtype,
                   generator=generator) * total
    token = torch.searchsorted(cdf, u, right=True)  # first index whose CDF passes u
    # u rounded up to `total`: the last token of non-zero probability
    last = torch.searchsorted(cdf, total.contiguous(), right=False)
    return torch.minimum(token, last).squeeze(-1)


def processed_log_probs(logits: torch.Tensor, tokens: torch.Tensor, warpers) -> torch.Tensor:
    """Log-probs [B, V] of the distribution a token is drawn from (warpers applied)."""
    scores = logits.float()
    for warp in warpers:  # HF's warpers ignore the ids; they get the rows' tokens so far
        scores = warp(tokens, scores)
    return torch.log_softmax(scores, dim=-1)


@contextmanager
def flat_head(module):
    """The output head is given [B, H] rows and returns [B, 1, V] (see the docstring)."""
    head = module.get_output_embeddings()
    if head is None:
        yield
        return

    def flatten(_mod, args):
        x = args[0]
        return (x.reshape(-1, x.shape[-1]).contiguous(),) + tuple(args[1:]) \
            if x.dim() == 3 and x.shape[1] == 1 else None

    def unflatten(_mod, args, output):
        return output.unsqueeze(1) if output.dim() == 2 and args[0].dim() == 2 else None

    handles = [head.register_forward_pre_hook(flatten), head.register_forward_hook(unflatten)]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def cache_key(module) -> str:
    """The forward's KV cache argument (and output): `cache` since transformers 5.25,
    `past_key_values` before (still accepted there, with a FutureWarning)."""
    return _cache_key_of(type(module))


@functools.lru_cache(maxsize=None)
def _cache_key_of(cls) -> str:  # read once a class: the stream asks every decode step
    params = inspect.signature(cls.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def last_logits(module, key: str, **inputs) -> tuple[torch.Tensor, object]:
    """([B, V] logits of the last position, the KV cache), computing the head on that
    position only."""
    try:
        out = module(**inputs, logits_to_keep=1, use_cache=True)
    except TypeError:  # a model without logits_to_keep: the head on every position
        out = module(**inputs, use_cache=True)
    return out.logits[:, -1], getattr(out, key)


@torch.no_grad()
def decode(module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
           max_new_tokens: int, eos_ids: list[int], pad_id: int, warpers,
           greedy: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Up to `max_new_tokens` tokens per left-padded prompt row, stopping each row at
    its first EOS; (tokens [B, steps] long, log-probs [B, steps] float32), pad and 0
    after a row's EOS. `steps` is where the longest row ended."""
    rows, device = input_ids.shape[0], input_ids.device
    tokens = torch.full((rows, max_new_tokens), pad_id, dtype=torch.long, device=device)
    logps = torch.zeros(rows, max_new_tokens, dtype=torch.float32, device=device)
    eos = torch.as_tensor(eos_ids, device=device)
    live = torch.arange(rows, device=device)       # the batch's rows, as rows of `tokens`
    ended = torch.zeros(rows, dtype=torch.bool, device=device)
    mask = attention_mask.long()
    position = mask.sum(-1, keepdim=True)          # the next token's position per row
    key = cache_key(module)
    with flat_head(module):
        logits, cache = last_logits(module, key, input_ids=input_ids, attention_mask=mask,
                                     position_ids=position_ids_from_mask(mask))
    steps = 0
    for step in range(max_new_tokens):
        logp = processed_log_probs(logits, tokens[live, :step], warpers)
        chosen = logp.argmax(-1) if greedy else sample(logp)
        # a row that ended before this step (not yet dropped) gets pad and 0
        tokens[live, step] = chosen.masked_fill(ended, pad_id)
        logps[live, step] = logp.gather(-1, chosen[:, None]).squeeze(-1).masked_fill(ended, 0.0)
        steps = step + 1
        ended = ended | torch.isin(chosen, eos)
        if steps == max_new_tokens or bool(ended.all()):
            break
        if int(ended.sum()) * COMPACT_SHARE >= len(live):
            keep = (~ended).nonzero().squeeze(-1)
            cache.batch_select_indices(keep)
            live, chosen, mask, position = live[keep], chosen[keep], mask[keep], position[keep]
            ended = ended[keep]
        mask = torch.cat([mask, mask.new_ones(len(live), 1)], dim=1)
        logits, cache = last_logits(module, key, input_ids=chosen[:, None],
                                     attention_mask=mask, position_ids=position, **{key: cache})
        position = position + 1
    return tokens[:, :steps], logps[:, :steps]
