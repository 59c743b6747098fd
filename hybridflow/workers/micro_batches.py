"""Micro-batches of a rollout batch: by row count, or by a token budget.

Row micro-batches (`max_tokens` unset) are consecutive slices of `rows` rows, as
the workers always cut them. A token budget (`*.max_tokens_per_micro_batch`, verl's
`use_dynamic_bsz`) instead groups rows by length so that each micro-batch's padded
size, rows x its longest row, stays within the budget, and trims each micro-batch to
its own longest row: the columns every row of it pads are dropped, so short rows
cost short forwards. Rows are ordered longest first (a stable sort: deterministic);
a row longer than the budget on its own gets a micro-batch of its own.

Trimming follows the rollout layout (`sequences.py`): `[left-padded prompt |
right-padded response]`. Tensors of the full row's width [B, P + R] lose prompt
columns on the left and response columns on the right; tensors of the response's
width [B, R] lose columns on the right. A row's extent is read from
`attention_mask` (its first and last attended column), so the dropped columns are
never attended and every masked quantity is unchanged.

Packed (`model.use_remove_padding`, `packing.py`): a micro-batch runs as one row of
its real tokens, so the budget counts real tokens: the sum of the rows' lengths
(prompt + response, from `attention_mask`) stays within `max_tokens`, not rows x
the longest. Stateless.
"""
from __future__ import annotations

import torch

from hybridflow.core.batch import Batch

__all__ = ["MicroBatch", "micro_batches", "row_extents", "scatter_rows"]


class MicroBatch:
    """Rows of the parent batch (`index`, in their order there) and the batch itself."""

    def __init__(self, index: torch.Tensor, batch: Batch):
        self.index, self.batch = index, batch


def row_extents(batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
    """(prompt tokens from the first attended column to the response, response
    columns up to the last attended one) per row; [B] each."""
    mask = batch["attention_mask"].bool()
    prompt_width = mask.shape[1] - batch["responses"].shape[1]
    cols = torch.arange(mask.shape[1], device=mask.device)
    first = torch.where(mask, cols, mask.shape[1]).min(dim=1).values.clamp(max=prompt_width)
    last = torch.where(mask, cols + 1, 0).max(dim=1).values.clamp(min=prompt_width)
    return (prompt_width - first).cpu(), (last - prompt_width).cpu()


def micro_batches(batch: Batch, rows: int, max_tokens: int | None = None,
                  packed: bool = False) -> list[MicroBatch]:
    """The micro-batches of `batch`: slices of `rows` rows, or, with `max_tokens`,
    length-sorted groups within the budget (padded tokens, or real tokens when
    `packed`), each trimmed to its longest row."""
    if not max_tokens:
        return [MicroBatch(torch.arange(i, min(i + rows, len(batch))),
                           batch.take(slice(i, i + rows))) for i in range(0, len(batch), rows)]
    prompt_len, response_len = row_extents(batch)
    order = torch.argsort(prompt_len + response_len, descending=True, stable=True)
    groups = _fill_budget(order, prompt_len, response_len, max_tokens, packed)
    return [MicroBatch(index, _trim(batch.take(index), int(prompt_len[index].max()),
                                    int(response_len[index].max()))) for index in groups]


def _fill_budget(order, prompt_len, response_len, max_tokens: int,
                 packed: bool = False) -> list[torch.Tensor]:
    """Consecutive runs of `order` whose rows x (longest prompt + longest response),
    or when `packed` whose summed lengths, stay within `max_tokens` (at least one
    row each)."""
    groups, current, p_max, r_max, real = [], [], 0, 0, 0
    for row in order.tolist():
        length = int(prompt_len[row]) + int(response_len[row])
        p, r = max(p_max, int(prompt_len[row])), max(r_max, int(response_len[row]))
        cost = real + length if packed else (len(current) + 1) * (p + r)
        if current and cost > max_tokens:
            groups.append(torch.tensor(current))
            current, p, r, real = [], int(prompt_len[row]), int(response_len[row]), 0
        current.append(row)
        p_max, r_max, real = p, r, real + length
    if current:
        groups.append(torch.tensor(current))
    return groups


def _trim(micro: Batch, prompt_keep: int, response_keep: int) -> Batch:
    """Drop the columns no row of `micro` attends: the prompt's left, the response's right."""
    response_width = micro["responses"].shape[1]
    full_width = micro["input_ids"].shape[1]
    prompt_width = full_width - response_width
    for key in micro.keys():
        value = micro[key]
        if not isinstance(value, torch.Tensor) or value.dim() < 2:
            continue
        if value.shape[1] == full_width and prompt_width > 0:
            micro[key] = value[:, prompt_width - prompt_keep:prompt_width + response_keep]
        elif value.shape[1] == response_width:
            micro[key] = value[:, :response_keep]
    return micro


def scatter_rows(parts: list[tuple[torch.Tensor, torch.Tensor]], rows: int, width: int
                 ) -> torch.Tensor:
    """Per-micro-batch results [b, r <= width] put back at their rows of a [rows, width]
    tensor (zeros in the trimmed columns); `parts` are (row index, result) pairs."""
    first = parts[0][1]
    out = first.new_zeros((rows, width) + tuple(first.shape[2:]))
    for index, value in parts:
        out[index, :value.shape[1]] = value
    return out
