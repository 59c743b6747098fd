"""Ulysses sequence-parallel attention: the heads exchanged by all-to-all around a
model's own attention, so each rank of an sp group holds `s / sp` positions of every
layer's activations and still attends over the whole sequence.

A Hugging Face decoder layer computes q, k, v for its rank's slice of the sequence,
`[b, h, s/sp, d]` (RoPE already applied at the slice's global positions), and calls its
attention implementation by name (transformers' `AttentionInterface`). The
`hybridflow_ulysses_<inner>` implementations registered here exchange heads for
positions before the inner attention and back after it:

    q, k, v [b, h, s/sp, d] --all-to-all--> [b, h/sp, s, d] --inner attention-->
    [b, s, h/sp, d] --all-to-all--> [b, s/sp, h, d]  (what o_proj reads)

Rank i keeps heads i*h/sp ... (i+1)*h/sp - 1 and key/value heads i*kv/sp ...: the query
heads of a grouped-query group stay with their key/value head, so sp must divide both
counts (checked before launch, `sequence_parallel.check_model`). The inner attention is
the model's own (`sdpa`, `eager`, or `sdpa_varlen`, varlen_attention.py), called with the
mask the unsplit model would have built for the whole sequence
(`SequenceSplit.full_mask`): the mask transformers builds from the slice is not read.
A call without a `sequence_split` (generation, a forward outside a sequence-parallel
pass) is the inner attention itself, with the inner's own mask (each name registers its
inner's mask function), so a module shared with the rollout generates as before.

The all-to-all's backward is the same exchange the other way (`_AllToAll`), so
gradients reach the rank that computed each q, k, v. `torch.distributed.all_to_all_single`
runs on gloo between CPU ranks (tested) and on NCCL (unrun here: no GPUs).
State: the registrations in transformers' global interfaces (idempotent).
"""
from __future__ import annotations

import copy
import sys
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

__all__ = ["PREFIX", "INNER", "SequenceSplit", "heads_to_sequence", "sequence_to_heads",
           "ulysses_attention", "register_ulysses", "inner_attention_name"]

PREFIX = "hybridflow_ulysses_"
INNER = ("sdpa", "eager", "sdpa_varlen")  # the attentions this wraps (and their masks')
_MASKS = {"sdpa": "sdpa", "eager": "eager", "sdpa_varlen": "sdpa"}


@dataclass
class SequenceSplit:
    """One sequence-parallel forward: the sp group, this rank's place in it, and the
    whole sequence's attention inputs (what the slice's attention attends over)."""
    group: object                      # the sp process group (None: the default group)
    sp: int
    rank: int                          # this rank's index in the sp group
    length: int                        # padded length of the whole sequence (sp | length)
    attention_mask: torch.Tensor | None  # [b, length] (None: packed, or no padding)
    position_ids: torch.Tensor         # [b or 1, length], global positions
    cu_seq_lens: torch.Tensor | None = None  # packed rows' offsets, ending at `length`
    _masks: dict = field(default_factory=dict, repr=False)

    def full_mask(self, module, query: torch.Tensor, inner: str):
        """The mask the unsplit model builds for the whole sequence, for `inner`'s
        attention (built once per forward and dtype: every layer reads the same)."""
        key = (inner, query.dtype)
        if key not in self._masks:
            from transformers.masking_utils import create_causal_mask
            config = copy.copy(module.config)
            config._attn_implementation = _MASKS[inner]
            embeds = query.new_empty(query.shape[0], self.length, 0)
            self._masks[key] = create_causal_mask(
                config=config, inputs_embeds=embeds, attention_mask=self.attention_mask,
                cache=None, position_ids=self.position_ids)
        return self._masks[key]


class _AllToAll(torch.autograd.Function):
    """`all_to_all_single` over dim 0 (chunk i to rank i); the backward sends each
    gradient chunk back where its input came from (the same exchange)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group) -> torch.Tensor:
        ctx.group = group
        x = x.contiguous()  # empty_like keeps a permuted tensor's strides: not these
        out = torch.empty_like(x)
        dist.all_to_all_single(out, x, group=group)
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        grad = grad.contiguous()
        out = torch.empty_like(grad)
        dist.all_to_all_single(out, grad, group=ctx.group)
        return out, None


def heads_to_sequence(x: torch.Tensor, group, sp: int) -> torch.Tensor:
    """[b, h, s/sp, d] (all heads, this rank's positions) -> [b, h/sp, s, d] (this
    rank's heads, every position)."""
    b, h, s, d = x.shape
    x = x.reshape(b, sp, h // sp, s, d).permute(1, 0, 2, 3, 4)  # chunk i: heads of rank i
    x = _AllToAll.apply(x, group)  # chunk j: rank j's positions of this rank's heads
    return x.permute(1, 2, 0, 3, 4).reshape(b, h // sp, sp * s, d)


def sequence_to_heads(x: torch.Tensor, group, sp: int) -> torch.Tensor:
    """[b, s, h/sp, d] (this rank's heads, every position) -> [b, s/sp, h, d]."""
    b, s, h, d = x.shape
    x = x.reshape(b, sp, s // sp, h, d).permute(1, 0, 2, 3, 4)  # chunk i: rank i's positions
    x = _AllToAll.apply(x, group)  # chunk j: rank j's heads at this rank's positions
    return x.permute(1, 2, 0, 3, 4).reshape(b, s // sp, sp * h, d)


def _inner_function(module, inner: str):
    """The model's own attention function named `inner` (eager lives in its modeling file)."""
    if inner == "eager":
        eager = getattr(sys.modules[type(module).__module__], "eager_attention_forward", None)
        if eager is None:
            raise ValueError(f"{type(module).__name__} has no eager_attention_forward: "
                             "sequence parallelism cannot wrap its attention")
        return eager
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
    if inner == "sdpa_varlen":
        from hybridflow.workers.varlen_attention import register_varlen_attention
        register_varlen_attention()
    return ALL_ATTENTION_FUNCTIONS[inner]


def ulysses_attention(module, query, key, value, attention_mask, *, inner: str,
                      sequence_split: SequenceSplit | None = None, **kwargs):
    """The inner attention over the whole sequence, fed and read by all-to-all."""
    attend = _inner_function(module, inner)
    split = sequence_split
    if split is None or split.sp == 1:
        return attend(module, query, key, value, attention_mask, **kwargs)
    query, key, value = (heads_to_sequence(t, split.group, split.sp) for t in (query, key, value))
    if split.cu_seq_lens is not None:  # packed: the varlen attention reads global offsets
        kwargs.update(cu_seq_lens_q=split.cu_seq_lens, cu_seq_lens_k=split.cu_seq_lens)
    kwargs["position_ids"] = split.position_ids
    out, _ = attend(module, query, key, value, split.full_mask(module, query, inner), **kwargs)
    return sequence_to_heads(out, split.group, split.sp), None


def _named(inner: str):
    def attention(module, query, key, value, attention_mask, **kwargs):
        return ulysses_attention(module, query, key, value, attention_mask, inner=inner,
                                 **kwargs)
    attention.__name__ = PREFIX + inner
    return attention


def register_ulysses(inner: str) -> str:
    """Register the Ulysses wrapper of `inner` (and `inner`'s mask under its name);
    return the name to set as the model's attention implementation."""
    if inner not in INNER:
        raise ValueError(f"sequence parallelism wraps the attention implementations "
                         f"{list(INNER)}, not {inner!r}; set model.attn_implementation to one")
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS
    name = PREFIX + inner
    AttentionInterface.register(name, _named(inner))
    AttentionMaskInterface.register(name, ALL_MASK_ATTENTION_FUNCTIONS[_MASKS[inner]])
    return name


def inner_attention_name(name: str | None) -> str | None:
    """The inner attention of a registered wrapper's name, or None for another name."""
    if name and name.startswith(PREFIX):
        return name[len(PREFIX):]
    return None
