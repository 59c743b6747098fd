"""The stream loop's KV cache: one batch for the active slots, kept across decode steps.

The active sequences' keys and values live in one left-padded batch (a `DynamicCache`,
one `[rows, kv_heads, width, head_dim]` pair per layer) beside its attention mask
`[rows, width]` and each row's length (the next token's position). A decode step runs
the model on one new token per row over that cache, as HF `generate` and the engine's
batched loop (hf_decode.py) do: the cache grows by one column, the rows' order is the
slots'. Rows change only when a request joins or leaves:
- `join` appends the rows of a prefill (new requests, or ones whose cache other
  weights computed), both batches left-padded to the wider one;
- `keep` selects the rows still decoding and drops the leading columns that are
  padding in every row (the longest sequence left), so the width follows the longest
  active sequence instead of growing with the stream.
Until this module kept it, each sequence held a cache of its own and every step
stacked them into a batch and split the grown batch back, layer by layer and row by
row: a quarter of the stream thread's time on SmolLM2, more than the forward's
(docs/async.md).

The prefill's head runs on the last position only (`last_logits`), the decode's on
[rows, hidden] rows (`flat_head`), as in hf_decode.py.

State: `cache`, `mask`, `lengths` (None when no row is cached) and `version` (the
weights version that computed every cached row). The stream loop owns one and is the
only caller; rows are in the loop's `active` order.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from hybridflow.workers.rollout.hf_decode import cache_key, flat_head, last_logits
from hybridflow.workers.sequences import position_ids_from_mask

__all__ = ["SlotCache", "prefill"]


def _left_padded(seqs: list[list[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, seq in enumerate(seqs):
        ids[i, width - len(seq):] = torch.tensor(seq, dtype=torch.long)
        mask[i, width - len(seq):] = 1
    return ids, mask


def prefill(module, seqs: list[list[int]], pad: int, device
            ) -> tuple[torch.Tensor, object, torch.Tensor]:
    """Whole sequences in one left-padded forward: (next-token logits [B, V], their
    cache, its mask [B, width])."""
    ids, mask = _left_padded(seqs, pad)
    ids, mask = ids.to(device), mask.to(device)
    with flat_head(module):
        logits, cache = last_logits(module, cache_key(module), input_ids=ids,
                                    attention_mask=mask,
                                    position_ids=position_ids_from_mask(mask))
    return logits, cache, mask


def _pad_left(x: torch.Tensor, width: int, dim: int) -> torch.Tensor:
    """`x` left-padded with zeros to `width` along `dim` (2 for keys, 1 for a mask)."""
    extra = width - x.shape[dim]
    if extra == 0:
        return x
    pads = [0, 0] * (x.dim() - 1 - dim) + [extra, 0]
    return F.pad(x, pads)


class SlotCache:
    def __init__(self):
        self.cache, self.mask, self.lengths = None, None, None
        self.version: int | None = None

    @property
    def rows(self) -> int:
        return 0 if self.mask is None else self.mask.shape[0]

    def clear(self) -> None:
        self.cache, self.mask, self.lengths, self.version = None, None, None, None

    def decode(self, module, last: torch.Tensor) -> torch.Tensor:
        """One token per cached row (`last` [rows]: each row's newest token, not yet
        cached): the next-token logits [rows, V]; the cache grows by that token."""
        key = cache_key(module)
        mask = torch.cat([self.mask, self.mask.new_ones(self.rows, 1)], dim=1)
        with flat_head(module):
            logits, cache = last_logits(module, key, input_ids=last[:, None],
                                        attention_mask=mask,
                                        position_ids=self.lengths[:, None],
                                        **{key: self.cache})
        self.cache, self.mask, self.lengths = cache, mask, self.lengths + 1
        return logits

    def join(self, cache, mask: torch.Tensor, version: int) -> None:
        """Append a prefill's rows (its cache and mask) after the cached ones."""
        lengths = mask.sum(-1)
        if self.cache is None:
            self.cache, self.mask, self.lengths, self.version = cache, mask, lengths, version
            return
        if version != self.version:
            raise RuntimeError(f"stream cache: rows of weights version {version} joined rows "
                               f"of version {self.version}; a version change clears it")
        width = max(self.mask.shape[1], mask.shape[1])
        for mine, theirs in zip(self.cache.layers, cache.layers):
            mine.keys = torch.cat([_pad_left(mine.keys, width, 2),
                                   _pad_left(theirs.keys, width, 2)])
            mine.values = torch.cat([_pad_left(mine.values, width, 2),
                                     _pad_left(theirs.values, width, 2)])
        self.mask = torch.cat([_pad_left(self.mask, width, 1), _pad_left(mask, width, 1)])
        self.lengths = torch.cat([self.lengths, lengths])

    def keep(self, rows: torch.Tensor) -> None:
        """Only `rows` (indices, in order) stay; columns of padding only are dropped."""
        if len(rows) == 0:
            self.clear()
            return
        mask = self.mask[rows]
        first = int(mask.any(0).int().argmax())  # columns before: padding in every row
        self.cache.batch_select_indices(rows)
        if first:
            for layer in self.cache.layers:
                layer.keys, layer.values = layer.keys[:, :, first:], layer.values[:, :, first:]
        self.mask, self.lengths = mask[:, first:], self.lengths[rows]
