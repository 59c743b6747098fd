"""Sequence layout shared by the workers, and the response log-prob forward.

A rollout row is `[left-padded prompt | right-padded response]`: `input_ids` and
`attention_mask` are [B, P + R], `responses` and `response_mask` are [B, R]. The
logit that predicts response token t sits at position P + t - 1, so the response
slice of the logits is `[:, -R - 1:-1]`.

The training mask: `response_mask` is what attention covers; an agent rollout adds
`loss_mask` [B, R], 1 on the model's tokens only (its observation/tool tokens are 0).
Losses, advantages, KL and per-token metrics use `training_mask(batch)`: `loss_mask`
when the batch has one of the responses' width, else `response_mask`. (`actor.sft`'s
`loss_mask` spans the whole row, [B, P + R]: it is not a response mask.)

`packed=True` (`model.use_remove_padding`) runs each micro-batch as one row of its
real tokens (`packing.py`) and returns the same [B, R] results, 0 where a response
token is not attended.

`logprob_chunk` (`actor.logprob_chunk`, `ref.logprob_chunk`) computes the log-probs and
entropy a chunk of positions at a time from the head's input (`chunked_logprobs.py`):
0 never, N positions, None as many as keep a chunk's logits under 64 MiB; a forward
with no more positions than one chunk computes them from whole logits, as before.

In a sequence-parallel pass (`parallel/sequence_parallel.py`) a rank's forward holds
`1/sp` of each row's positions: the head is applied to the positions of its slice
that predict a response token (chunked or not), labelled from the whole row, and the
ranks' [n] results are summed into the whole [N] (`ResponseHidden.whole`), so a rank
holds its slice's logits only.
"""
from __future__ import annotations

from typing import NamedTuple

import torch

from hybridflow.core.batch import Batch
from hybridflow.core.tokens import masked_mean, training_mask, training_mask_key
from hybridflow.workers.micro_batches import micro_batches, scatter_rows
from hybridflow.workers.chunked_logprobs import (chunk_positions, chunked_token_stats,
                                                head_input, output_head)
from hybridflow.workers.packing import PackedRows, packed_forward, packed_logits, packed_values
from hybridflow.workers.parallel.sequence_parallel import LocalSlice, local_output, splitting
# whole logits, or a tensor-parallel head's vocab-sharded ones (parallel/vocab_parallel.py)
from hybridflow.workers.parallel.vocab_parallel import entropy_from_logits, token_logprobs

__all__ = ["position_ids_from_mask", "response_mask_from_ids", "pad_right",
           "response_logits", "ResponseHidden", "response_hidden", "head_path", "head_stats",
           "response_positions", "chunked_response",
           "token_logprobs", "entropy_from_logits", "forward_response", "response_logprobs",
           "response_values", "response_values_batched", "masked_mean",
           "training_mask_key", "training_mask"]

_NO_LOGITS_TO_KEEP: set[type] = set()


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """0, 1, 2, ... over the real tokens; padding positions get 0."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def response_mask_from_ids(responses: torch.Tensor, eos_id: int | list[int]) -> torch.Tensor:
    """1 for every token up to and including the first EOS, 0 after it."""
    eos_ids = torch.as_tensor(eos_id if isinstance(eos_id, list) else [eos_id],
                              device=responses.device)
    is_eos = torch.isin(responses, eos_ids).long()
    eos_before = is_eos.cumsum(-1) - is_eos
    return (eos_before == 0).long()






def pad_right(x: torch.Tensor, length: int, value: int) -> torch.Tensor:
    if x.shape[1] >= length:
        return x[:, :length]
    fill = x.new_full((x.shape[0], length - x.shape[1]), value)
    return torch.cat([x, fill], dim=1)


def _logits(model, batch: Batch, keep: int) -> torch.Tensor:
    kwargs = dict(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                  position_ids=batch["position_ids"], use_cache=False)
    key = type(model)
    if key not in _NO_LOGITS_TO_KEEP:
        try:
            return model(**kwargs, logits_to_keep=keep).logits
        except TypeError:
            _NO_LOGITS_TO_KEEP.add(key)
    return model(**kwargs).logits[:, -keep:]


def response_logits(model, batch: Batch, temperature: float = 1.0) -> torch.Tensor:
    """Float32 logits [B, R, V] predicting each token of `responses`, over `temperature`."""
    width = batch["responses"].shape[1]
    logits = _logits(model, batch, width + 1)[:, :-1].float()
    return logits / temperature if temperature != 1.0 else logits








def response_positions(batch: Batch, rows: PackedRows | None) -> int:
    """Positions whose logits a response forward reads: B x R, or the packed K."""
    return len(rows.keep) if rows is not None else batch["responses"].numel()


class ResponseHidden(NamedTuple):
    """The head's input at the positions that predict response tokens this rank holds,
    [n, H], and those tokens [n]; `whole` turns values of these positions, [n, ...], into
    all N positions' (N = B x R in row order, or the packed K) on every rank."""
    hidden: torch.Tensor
    tokens: torch.Tensor
    total: int
    index: torch.Tensor | None = None  # places among the N (None: all N, in order)
    split: LocalSlice | None = None

    def whole(self, values: torch.Tensor | None) -> torch.Tensor | None:
        if values is None or self.split is None:
            return values
        return self.split.combine(values, self.index, self.total)


def head_path(model) -> bool:
    """Whether a sequence-parallel forward of `model` reduces its own slice's positions
    (its head can be applied alone: `chunked_logprobs.output_head`); else the logits are
    gathered whole and reduced as one rank's."""
    return splitting(model) and output_head(model) is not None


def response_hidden(model, batch: Batch, rows: PackedRows | None = None) -> ResponseHidden:
    """The head's input at the positions that predict response tokens and those tokens
    (this rank's slice of them in a sequence-parallel pass); the head itself runs on one
    position a row."""
    with head_input(model) as seen, local_output(model) as split:
        if rows is None:
            width = batch["responses"].shape[1]
            _logits(model, batch, width + 1)
        else:
            packed_forward(model, rows)
    hidden = seen[-1]
    if split:
        return _slice_hidden(hidden, batch, rows, split[-1])
    if rows is None:  # [B, R + 1, H], or every position without logits_to_keep
        hidden = hidden[:, hidden.shape[1] - width - 1:-1]
        tokens = batch["responses"].reshape(-1)
        return ResponseHidden(hidden.reshape(-1, hidden.shape[-1]), tokens, len(tokens))
    if hidden.shape[1] != len(rows.keep):  # a model without logits_to_keep
        hidden = hidden[:, rows.keep]
    return ResponseHidden(hidden[0], rows.tokens, len(rows.tokens))


def _slice_hidden(hidden, batch: Batch, rows: PackedRows | None,
                  split: LocalSlice) -> ResponseHidden:
    """This rank's positions [start, start + width) of the whole row: those that predict
    a response token, their tokens (read from the whole row: a slice's last position
    predicts the next slice's first token) and their places among the N."""
    end = split.start + hidden.shape[1]
    if rows is not None:  # packed: the kept positions falling in this slice
        mine = (rows.keep >= split.start) & (rows.keep < end)
        index = mine.nonzero().squeeze(1)
        return ResponseHidden(hidden[0, rows.keep[index] - split.start], rows.tokens[index],
                              len(rows.tokens), index, split)
    responses = batch["responses"]
    width = responses.shape[1]
    first = split.length - width - 1  # the column predicting the first response token
    low = max(first, split.start)  # none where the slice ends before the response
    columns = torch.arange(low, max(low, min(first + width, end)), device=hidden.device)
    picked = hidden[:, columns - split.start]  # [B, c, H]
    places = columns - first
    index = (torch.arange(responses.shape[0], device=hidden.device).unsqueeze(1) * width
             + places).reshape(-1)
    return ResponseHidden(picked.reshape(-1, picked.shape[-1]), responses[:, places].reshape(-1),
                          responses.numel(), index, split)


def head_stats(model, part: ResponseHidden, setting: int | None, temperature: float = 1.0,
                with_entropy: bool = False, entropy_grad: bool = True):
    """Log-probs and entropy [N] from the head's input: a chunk of positions' logits at a
    time where `setting` (`logprob_chunk`) chunks the positions this rank holds, else one
    head call over them."""
    head = output_head(model)
    chunk = chunk_positions(setting, model, len(part.hidden))
    if chunk is not None:
        log_probs, entropy = chunked_token_stats(head, part.hidden, part.tokens, chunk,
                                                 temperature, with_entropy)
        if entropy is not None and not entropy_grad:
            entropy = entropy.detach()
    else:
        logits = head(part.hidden).float()
        logits = logits / temperature if temperature != 1.0 else logits
        log_probs, entropy = _whole_response(logits, part.tokens, with_entropy, entropy_grad)
    return part.whole(log_probs), part.whole(entropy)


def chunked_response(model, batch: Batch, rows: PackedRows | None, setting: int | None,
                     temperature: float = 1.0, with_entropy: bool = False,
                     entropy_grad: bool = True):
    """`forward_response`'s log-probs and entropy from the head's input (`head_stats`):
    [B, R] each, or packed [K]."""
    log_probs, entropy = head_stats(model, response_hidden(model, batch, rows), setting,
                                    temperature, with_entropy, entropy_grad)
    if rows is None:
        shape = batch["responses"].shape
        log_probs = log_probs.view(shape)
        entropy = entropy.view(shape) if entropy is not None else None
    return log_probs, entropy


def forward_response(model, batch: Batch, temperature: float = 1.0,
                     with_entropy: bool = False, entropy_grad: bool = True,
                     packed: bool = False, logprob_chunk: int | None = None
                     ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-token log-prob of `responses` [B, R] (float32), and the entropy if asked
    (detached unless `entropy_grad`: a metric costs no backward memory)."""
    rows = PackedRows(batch) if packed else None
    split = head_path(model)  # sequence-parallel: each rank reduces its own positions
    chunk = None if split else chunk_positions(logprob_chunk, model,
                                               response_positions(batch, rows))
    if chunk is not None or split:
        log_probs, entropy = chunked_response(model, batch, rows, logprob_chunk, temperature,
                                              with_entropy, entropy_grad)
    elif rows is None:
        log_probs, entropy = _whole_response(response_logits(model, batch, temperature),
                                             batch["responses"], with_entropy, entropy_grad)
    else:  # [K, V]: only the response tokens' logits, unpacked after the reduction
        log_probs, entropy = _whole_response(packed_logits(model, rows, temperature),
                                             rows.tokens, with_entropy, entropy_grad)
    if rows is not None:
        log_probs = rows.unpack(log_probs)
        entropy = rows.unpack(entropy) if entropy is not None else None
    return log_probs, entropy


def _whole_response(logits, tokens, with_entropy: bool, entropy_grad: bool):
    log_probs, entropy = token_logprobs(logits, tokens), None
    if with_entropy:
        with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
            entropy = entropy_from_logits(logits if entropy_grad else logits.detach())
    return log_probs, entropy


def response_values(model, batch: Batch, packed: bool = False) -> torch.Tensor:
    """Value per response token [B, R], float32, masked to 0 outside `response_mask`,
    read at the position that predicts the token (the log-probs' slice), as in verl."""
    width = batch["responses"].shape[1]
    if packed:
        rows = PackedRows(batch)
        values = rows.unpack(packed_values(model, rows))
    else:
        out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                    position_ids=batch["position_ids"], use_cache=False)
        values = out.logits.squeeze(-1)[:, -width - 1:-1].float()
    if "response_mask" in batch:
        values = values * batch["response_mask"].to(values.dtype)
    return values


@torch.no_grad()
def response_logprobs(model, batch: Batch, micro_batch_size: int, device,
                      temperature: float = 1.0, with_entropy: bool = False,
                      max_tokens: int | None = None, packed: bool = False,
                      logprob_chunk: int | None = None):
    """`forward_response` over micro-batches (rows, or a token budget: see
    `micro_batches.py`), without gradient; results on CPU. Under a token budget the
    columns a micro-batch trims (past every row's last token) hold 0."""
    width = batch["responses"].shape[1]
    if len(batch) == 0:
        empty = torch.zeros(0, width, dtype=torch.float32)
        return empty, (empty.clone() if with_entropy else None)
    logps, ents = [], []
    for micro in micro_batches(batch, micro_batch_size, max_tokens, packed):
        logp, ent = forward_response(model, micro.batch.to(device), temperature, with_entropy,
                                     packed=packed, logprob_chunk=logprob_chunk)
        logps.append((micro.index, logp.cpu()))
        if ent is not None:
            ents.append((micro.index, ent.cpu()))
    return (scatter_rows(logps, len(batch), width),
            scatter_rows(ents, len(batch), width) if with_entropy else None)


@torch.no_grad()
def response_values_batched(model, batch: Batch, micro_batch_size: int, device,
                            max_tokens: int | None = None, packed: bool = False
                            ) -> torch.Tensor:
    """`response_values` over micro-batches (rows or a token budget), on CPU."""
    width = batch["responses"].shape[1]
    if len(batch) == 0:
        return torch.zeros(0, width)
    parts = [(micro.index, response_values(model, micro.batch.to(device), packed).cpu())
             for micro in micro_batches(batch, micro_batch_size, max_tokens, packed)]
    return scatter_rows(parts, len(batch), width)
