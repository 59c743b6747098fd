"""Packed sequences: a micro-batch's rows run as one row with no padding.

Under `model.use_remove_padding` the training-side forwards (actor log-probs and
update, reference log-probs, critic values and update) do not run the model on pad
tokens. `PackedRows(batch)` takes every row's attended tokens (`attention_mask` 1),
in row order, into one row `[1, T]`, T the sum of the rows' real lengths, with each
row's own `position_ids` (0, 1, 2, ... restarting at every row). The model is called
with those and **no attention mask**: Hugging Face's mask builder
(`transformers.masking_utils.find_packed_sequence_indices`) reads a restart of the
position ids as the start of a new sequence and builds a block-diagonal causal mask,
so no token attends to another row's; flash-attention-2 turns the same position ids
into varlen `cu_seqlens` and never builds a mask.

What it saves and what it does not: the embeddings, every MLP, the norms and the
projections run on T tokens instead of rows x width, and the vocabulary projection
only on the positions that predict a response token (`logits_to_keep` as an index
tensor). Attention under sdpa/eager (the CPU) is a dense `[T, T]` block-diagonal
mask: its score matrix costs T^2 per head, where the padded batch's costs rows x
width^2, so packing many rows into one long row would spend *more* on attention
than padding did. Hence models built with sdpa under `model.use_remove_padding`
use `sdpa_varlen` (`varlen_attention.py`): one causal sdpa per packed sequence,
sum(length^2), as flash-attention's varlen kernel costs on a GPU; the forward
passes the sequences' offsets (`cu_seq_lens_q`) for both. Eager attention keeps
the dense mask; a token budget (`*.max_tokens_per_micro_batch`, which counts real
tokens when packing) bounds T there.

Results come back in the padded layout: a value per response token, `[B, R]`,
0 where the token is not attended (as a token-budget micro-batch's trimmed columns).
Assumes the rollout layout (`sequences.py`): response token t of a row is column
P + t of `input_ids`, predicted at column P + t - 1. Stateless.
"""
from __future__ import annotations

import torch

from hybridflow.core.batch import Batch

__all__ = ["PackedRows", "packed_forward", "packed_logits", "packed_values"]


class PackedRows:
    """One micro-batch packed into one row, and where its response tokens sit.

    input_ids, position_ids: [1, T]; `offsets`: [B + 1] int32, where each row starts
    (flash-attention's `cu_seqlens`), `longest` its longest row; `keep`: [K] packed
    positions whose logits
    predict a response token, ascending; `rows`, `cols`: [K] that token's place in
    the `[B, R]` response layout; `tokens`: [K] the token ids (`responses[rows, cols]`).
    """

    def __init__(self, batch: Batch):
        attended = batch["attention_mask"].bool()
        n_rows, width = attended.shape
        self.shape = (n_rows, batch["responses"].shape[1])
        prompt_width = width - self.shape[1]
        self.input_ids = batch["input_ids"][attended].unsqueeze(0)
        self.position_ids = batch["position_ids"][attended].unsqueeze(0)
        lengths = attended.sum(dim=1)
        _check_restarts(self.position_ids[0], lengths)
        self.offsets = torch.cat([lengths.new_zeros(1), lengths.cumsum(0)]).to(torch.int32)
        self.longest = int(lengths.max()) if n_rows else 0
        slot = attended.flatten().long().cumsum(0).view(n_rows, width) - 1
        # the column before each response token: its predictor (none before column 0)
        before = torch.cat([attended.new_zeros(n_rows, 1), attended[:, :-1]], dim=1)
        slot_before = torch.cat([slot.new_zeros(n_rows, 1), slot[:, :-1]], dim=1)
        target = attended[:, prompt_width:] & before[:, prompt_width:]
        self.rows, self.cols = target.nonzero(as_tuple=True)
        self.keep = slot_before[:, prompt_width:][target]
        self.tokens = batch["responses"][self.rows, self.cols]

    def __len__(self) -> int:
        return self.input_ids.shape[1]

    def unpack(self, values: torch.Tensor) -> torch.Tensor:
        """[K, ...] values of the kept positions -> [B, R, ...], zeros elsewhere
        (differentiable: gradients reach `values` through the scatter)."""
        out = values.new_zeros(self.shape + tuple(values.shape[1:]))
        return out.index_put((self.rows, self.cols), values)


def _check_restarts(positions: torch.Tensor, lengths: torch.Tensor) -> None:
    """Rows are told apart by their position ids restarting: refuse rows whose first
    position continues the previous row's last one (they would attend to each other)."""
    ends = lengths.cumsum(0)
    starts = ends - lengths
    nonempty = lengths > 0
    starts, ends = starts[nonempty], ends[nonempty]
    if len(starts) < 2:
        return
    first, last_before = positions[starts[1:]], positions[ends[:-1] - 1]
    if bool((first == last_before + 1).any()):
        raise ValueError(
            "model.use_remove_padding: a row's position_ids continue the previous row's "
            "(they must restart at 0 on each row's first attended token, as the rollout "
            "writes them); recompute position_ids from attention_mask or turn "
            "model.use_remove_padding off")


def _check_not_empty(packed: PackedRows) -> None:
    if len(packed) == 0:
        raise ValueError("model.use_remove_padding: a micro-batch has no attended token "
                         "(attention_mask is 0 on every row); drop empty rows before the "
                         "call or turn model.use_remove_padding off")


def _model_kwargs(packed: PackedRows) -> dict:
    # attention_mask=None is what makes transformers read the packing from position_ids;
    # the offsets are what flash-attention's and `sdpa_varlen`'s kernels read (others
    # ignore them)
    return dict(input_ids=packed.input_ids, position_ids=packed.position_ids,
                attention_mask=None, use_cache=False, cu_seq_lens_q=packed.offsets,
                cu_seq_lens_k=packed.offsets, max_length_q=packed.longest,
                max_length_k=packed.longest)


def packed_logits(model, packed: PackedRows, temperature: float = 1.0) -> torch.Tensor:
    """Float32 logits [K, V] at the positions that predict response tokens. With no
    response token (K = 0) the model still runs: the loss keeps a graph to backward
    through, as the padded forward's does."""
    logits = packed_forward(model, packed).logits[0]
    if logits.shape[0] != len(packed.keep):  # a model without logits_to_keep
        logits = logits[packed.keep]
    logits = logits.float()
    return logits / temperature if temperature != 1.0 else logits


def packed_forward(model, packed: PackedRows):
    """The model's output on the packed row, its head applied at the kept positions only
    (at every position for a model without `logits_to_keep`)."""
    _check_not_empty(packed)
    try:
        return model(**_model_kwargs(packed), logits_to_keep=packed.keep)
    except TypeError:  # a model without logits_to_keep: project every position
        return model(**_model_kwargs(packed))


def packed_values(model, packed: PackedRows) -> torch.Tensor:
    """Float32 values [K] (a token-level head of width 1) at the predicting positions."""
    _check_not_empty(packed)
    return model(**_model_kwargs(packed)).logits[0, packed.keep, 0].float()
