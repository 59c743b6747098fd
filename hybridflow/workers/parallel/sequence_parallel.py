"""Sequence parallelism (Ulysses) around a role's model: each rank of an sp group runs
`1/sp` of every row's positions through the layers, attention exchanging heads by
all-to-all (`ulysses.py`), and the model's output comes back whole on every rank.

`placement.parallel.<role>.sp` (the actor, reference and critic; `core/layout.RoleLayout`)
makes sp groups of sp ranks that receive the same rows (dispatch treats them as it
treats a tp group's replicas). Inside `sequence_parallel(model, ctx)` (the workers'
log-prob, value and training passes) every forward of the model is split:

    input_ids, attention_mask, position_ids [b, s]  --pad to a multiple of sp, slice-->
    [b, s/sp] on each rank (position ids stay global: RoPE sees the true positions)
    --layers (attention over all s, ulysses.py)--> logits [b, s/sp, V]
    --all-gather along the sequence--> [b, s, V], padding cut, `logits_to_keep` applied

so the callers (`sequences.py`, `packing.py`, `loss_inputs.py`, the trainer's dummy
step) compute log-probs, entropy and values from the same logits as one rank: the label
of a slice's last position is the next slice's first token because the shift happens
after the gather. A packed row (`model.use_remove_padding`) is split the same way; its
offsets stay global for the varlen attention. The gather's backward hands each rank its
own positions' gradient: summed over the sp ranks (the data-parallel wrap spans dp x sp
ranks, `training.py`) it is one rank's gradient. What sp does not divide: the gathered
logits ([b, s, V] on every rank) and the chunked log-probs, which a sequence-parallel
forward does not use (`splitting`).

Generation never runs sequence-parallel: outside the context the hooks pass the call
through and the attention is the model's own. State: per model, the installed
`SequenceParallel` (its hooks, `model._hybridflow_sp`); per thread, the models whose
forwards split now and each one's pending gather (`_LOCAL`).
"""
from __future__ import annotations

import threading
from contextlib import contextmanager, nullcontext

import torch
import torch.distributed as dist

from hybridflow.workers.parallel.ulysses import (INNER, SequenceSplit, inner_attention_name,
                                                 register_ulysses)

__all__ = ["SequenceParallel", "sequence_parallel", "splitting", "gather_sequence",
           "check_model"]

_LOCAL = threading.local()


def _active() -> set:
    if not hasattr(_LOCAL, "models"):
        _LOCAL.models, _LOCAL.pending = set(), {}
    return _LOCAL.models


def splitting(model) -> bool:
    """Whether `model`'s forwards split the sequence now (in this thread)."""
    inner = getattr(model, "module", model)  # a DDP wrapper's module
    return id(inner) in _active() or id(model) in _active()


class _GatherSequence(torch.autograd.Function):
    """All-gather along dim 1; the backward keeps this rank's positions' gradient."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group, sp: int, rank: int) -> torch.Tensor:
        ctx.rank, ctx.width = rank, x.shape[1]
        x = x.contiguous()
        parts = [torch.empty_like(x) for _ in range(sp)]
        dist.all_gather(parts, x, group=group)
        return torch.cat(parts, dim=1)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad.narrow(1, ctx.rank * ctx.width, ctx.width).contiguous(), None, None, None


def gather_sequence(x: torch.Tensor, group, sp: int, rank: int) -> torch.Tensor:
    """[b, s/sp, ...] on each rank of the sp group -> [b, s, ...] on every rank."""
    return _GatherSequence.apply(x, group, sp, rank)


def _pad(x: torch.Tensor | None, pad: int, value=0) -> torch.Tensor | None:
    if x is None or pad == 0:
        return x
    return torch.cat([x, x.new_full((x.shape[0], pad), value)], dim=1)


class SequenceParallel:
    """The hooks that split a model's forwards over an sp group (installed once)."""

    def __init__(self, model: torch.nn.Module, group, sp: int, rank: int):
        self.group, self.sp, self.rank = group, sp, rank
        config = model.config
        current = getattr(config, "_attn_implementation", None)
        if inner_attention_name(current) is None:  # the layers read the shared config
            config._attn_implementation = register_ulysses(current)
        model.register_forward_pre_hook(self._split, with_kwargs=True)
        model.register_forward_hook(self._gather)

    @contextmanager
    def active(self, model):
        models = _active()
        models.add(id(model))
        try:
            yield self
        finally:
            models.discard(id(model))
            _LOCAL.pending.pop(id(model), None)

    def _split(self, model, args, kwargs):
        if id(model) not in _active():
            return None
        if args:  # the workers call by keyword; a positional call is input_ids first
            kwargs = {"input_ids": args[0], **kwargs}
        ids = kwargs["input_ids"]
        length = ids.shape[1]
        padded = -(-length // self.sp) * self.sp
        pad = padded - length
        mask = kwargs.get("attention_mask")
        positions = kwargs.get("position_ids")
        if positions is None:  # what the model uses without a cache
            positions = torch.arange(length, device=ids.device).unsqueeze(0)
        if pad:  # the tail continues the last row's positions, masked where a mask is
            tail = positions[:, -1:] + torch.arange(1, pad + 1, device=ids.device)
            positions = torch.cat([positions, tail], dim=1)
        mask, ids = _pad(mask, pad), _pad(ids, pad)
        offsets = kwargs.get("cu_seq_lens_q")
        if offsets is not None and int(offsets[-1]) < padded:  # the tail: its own run
            offsets = torch.cat([offsets, offsets.new_tensor([padded])])
        width = padded // self.sp
        part = slice(self.rank * width, (self.rank + 1) * width)
        kwargs.update(input_ids=ids[:, part], position_ids=positions[:, part],
                      sequence_split=SequenceSplit(self.group, self.sp, self.rank, padded,
                                                   mask, positions, offsets))
        if mask is not None:
            kwargs["attention_mask"] = mask[:, part]
        keep = kwargs.pop("logits_to_keep", None)
        if keep is not None:
            kwargs["logits_to_keep"] = 0  # every local position: kept after the gather
        _LOCAL.pending[id(model)] = (length, keep)
        return (), kwargs

    def _gather(self, model, args, output):
        pending = _LOCAL.pending.pop(id(model), None) if hasattr(_LOCAL, "pending") else None
        if pending is None:
            return None
        length, keep = pending
        logits = gather_sequence(output.logits, self.group, self.sp, self.rank)[:, :length]
        if isinstance(keep, int) and keep > 0:
            logits = logits[:, -keep:]
        elif torch.is_tensor(keep):
            logits = logits[:, keep]
        output.logits = logits
        return output


def sequence_parallel(model: torch.nn.Module, ctx):
    """A context in which `model`'s forwards split over the role's sp group; a no-op
    context at sp=1. Installs the hooks on first use (every rank of the pool calls it:
    the sp groups are created collectively)."""
    if getattr(ctx, "sp", 1) <= 1:
        return nullcontext()
    layout = ctx.layout
    installed = model.__dict__.get("_hybridflow_sp")
    if installed is None:
        group = ctx.sequence_group()
        installed = SequenceParallel(model, group, layout.sp, layout.coords(ctx.rank).sp)
        model.__dict__["_hybridflow_sp"] = installed
    return installed.active(model)


def check_model(config: dict, layout, attn_implementation: str | None = "sdpa") -> None:
    """Refuse, before launch, a model sequence parallelism cannot run at `layout`:
    heads or key/value heads sp x tp does not divide, a sliding-window or non-causal
    attention (its mask is not the causal one this builds), an attention implementation
    it does not wrap. ValueError naming role, key and numbers."""
    role, sp, tp = layout.role, layout.sp, layout.tp
    where = f"placement.parallel.{role}.sp={sp}"
    heads = config.get("num_attention_heads")
    kv = config.get("num_key_value_heads") or heads
    if not isinstance(heads, int):
        raise ValueError(f"{where}: the model of role '{role}' ({config.get('model_type')}) "
                         "declares no num_attention_heads; sequence parallelism cannot wrap "
                         "its attention: set sp=1")
    for name, count in (("num_attention_heads", heads), ("num_key_value_heads", kv)):
        if count % (sp * tp):
            allowed = [d for d in range(1, count + 1) if heads % (d * tp) == 0
                       and kv % (d * tp) == 0]
            raise ValueError(
                f"{where}: sp x tp = {sp * tp} does not divide the model's {name}={count} "
                f"(role '{role}'): each rank attends with whole heads; sequence-parallel "
                f"sizes this model allows at tp={tp}: {allowed}")
    sliding = config.get("use_sliding_window", bool(config.get("sliding_window"))) or \
        "sliding_attention" in (config.get("layer_types") or ())
    if sliding:
        raise ValueError(f"{where}: the model of role '{role}' uses sliding-window attention, "
                         "which sequence parallelism does not wrap; set sp=1")
    inner = attn_implementation or "sdpa"
    if inner not in INNER and inner_attention_name(inner) is None:
        raise ValueError(f"{where}: model.attn_implementation={inner!r} cannot be wrapped "
                         f"for sequence parallelism (role '{role}'); use one of {list(INNER)}")
