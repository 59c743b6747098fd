"""Per-sequence KV caches for the stream loop's continuous batching.

Each sequence keeps its own keys and values (one `[1, kv_heads, length, head_dim]`
pair per layer), so a slot can take a new request at any step without touching the
others. A decode step stacks the active sequences' caches left-padded to the longest
(the padding masked out, each position id its sequence's own length), runs the model
on one token per sequence and splits the grown cache back: the model's work per token
is flat in the prefix length (the stacking copies the cache, which is memory traffic,
not a forward over the prefix). A prefill runs the whole sequence once, for a new
request or one whose cache was computed by other weights.

Stateless: the caches live on the stream loop's requests.
"""
from __future__ import annotations

import torch

from hybridflow.workers.sequences import position_ids_from_mask

__all__ = ["LayerKV", "prefill", "decode"]

LayerKV = list[tuple[torch.Tensor, torch.Tensor]]  # one (keys, values) pair per layer


def _cache_name() -> str:
    """The forward's cache argument and output field: `cache` since transformers
    renamed `past_key_values` (5.2x; vLLM's environment pins an older release)."""
    from transformers.modeling_outputs import CausalLMOutputWithPast
    return "cache" if "cache" in CausalLMOutputWithPast.__dataclass_fields__ \
        else "past_key_values"


def _left_padded(seqs: list[list[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, seq in enumerate(seqs):
        ids[i, width - len(seq):] = torch.tensor(seq, dtype=torch.long)
        mask[i, width - len(seq):] = 1
    return ids, mask


def _split(cache, lengths: list[int]) -> list[LayerKV]:
    """Each row's own cache (its last `length` positions: left padding dropped),
    copied out so the batch's tensors can be freed."""
    out: list[LayerKV] = [[] for _ in lengths]
    for layer in cache.layers:
        width = layer.keys.shape[2]
        for i, length in enumerate(lengths):
            out[i].append((layer.keys[i:i + 1, :, width - length:].clone(),
                           layer.values[i:i + 1, :, width - length:].clone()))
    return out


def prefill(module, seqs: list[list[int]], pad: int, device
            ) -> tuple[torch.Tensor, list[LayerKV]]:
    """The next-token logits [B, V] of whole sequences and each one's cache."""
    ids, mask = _left_padded(seqs, pad)
    ids, mask = ids.to(device), mask.to(device)
    out = module(input_ids=ids, attention_mask=mask, position_ids=position_ids_from_mask(mask),
                 use_cache=True)
    return out.logits[:, -1, :], _split(getattr(out, _cache_name()), [len(s) for s in seqs])


def decode(module, caches: list[LayerKV], last: list[int], device
           ) -> tuple[torch.Tensor, list[LayerKV]]:
    """One token per sequence (`last`: each one's newest token, not yet cached) on its
    cache: the next-token logits [B, V] and the grown caches."""
    from transformers import DynamicCache
    lengths = [kv[0][0].shape[2] for kv in caches]
    width = max(lengths)
    cache = DynamicCache(config=getattr(module, "config", None))
    for layer in range(len(caches[0])):
        keys, values = (_stack([kv[layer][part] for kv in caches], width) for part in (0, 1))
        cache.update(keys, values, layer)
    mask = torch.zeros((len(caches), width + 1), dtype=torch.long, device=device)
    for i, length in enumerate(lengths):
        mask[i, width - length:] = 1
    ids = torch.tensor(last, dtype=torch.long, device=device).unsqueeze(-1)
    positions = torch.tensor(lengths, dtype=torch.long, device=device).unsqueeze(-1)
    name = _cache_name()
    out = module(input_ids=ids, attention_mask=mask, position_ids=positions,
                 use_cache=True, **{name: cache})
    return out.logits[:, -1, :], _split(getattr(out, name), [n + 1 for n in lengths])


def _stack(parts: list[torch.Tensor], width: int) -> torch.Tensor:
    """[1, H, L_i, D] tensors left-padded with zeros into one [B, H, width, D]."""
    first = parts[0]
    out = first.new_zeros((len(parts), first.shape[1], width, first.shape[3]))
    for i, part in enumerate(parts):
        out[i, :, width - part.shape[2]:] = part[0]
    return out
