"""Sequence parallelism (Ulysses) around a role's model: each rank of an sp group runs
`1/sp` of every row's positions through the layers, attention exchanging heads by
all-to-all (`ulysses.py`), and the model's output comes back whole on every rank.

`placement.parallel.<role>.sp` (the actor, reference and critic; `core/layout.RoleLayout`)
makes sp groups of sp ranks that receive the same rows (dispatch treats them as it
treats a tp group's replicas). Inside `sequence_parallel(model, ctx)` (the workers'
log-prob, value and training passes) every forward of the model is split:

    input_ids, attention_mask, position_ids [b, s]  --pad to a multiple of sp, slice-->
    [b, s/sp] on each rank (position ids stay global: RoPE sees the true positions)
    --layers (attention over all s, ulysses.py)--> hidden [b, s/sp, H]

and then one of two ends:

- inside `local_output(model)` (the log-prob and entropy passes, `sequences.py`,
  `loss_inputs.py`): the output stays this rank's slice, and the forward records its
  `LocalSlice` (which global positions it holds). The caller applies the head to the
  slice's positions that predict a response token, each with its label from the whole
  row every rank holds (so a slice's last position predicts the next slice's first
  token), chunked or not (`chunked_logprobs.py`), and `LocalSlice.combine` sums the
  ranks' [n] log-probs and entropy into the whole [N] on every rank: no rank ever holds
  more than its slice's logits;
- otherwise (values, a loss that reads whole logits, the trainer's dummy step):
  logits [b, s/sp, V] --all-gather along the sequence--> [b, s, V], padding cut,
  `logits_to_keep` applied, as one rank's forward returns them.

A packed row (`model.use_remove_padding`) is split the same way; its offsets stay global
for the varlen attention.

With tensor parallelism (sp x tp, `core/layout.py`: tp innermost, an sp group is the
ranks of one dp slot with the same tp coordinate) the layers are the DTensor plan's:
each rank's q, k, v hold heads / tp heads, which the all-to-all splits again over sp
(sp x tp divides the heads, `check_model`); the vocabulary-sharded head's log-probs
reduce over tp first (`vocab_parallel.py`), then `LocalSlice.combine` over sp; gathered
logits gather their vocabulary shard along the sequence and stay a DTensor.

Both ends' backward hand each rank its own positions' gradient: summed over the sp
ranks (the data-parallel wrap spans dp x sp ranks, `training.py`; under tp the mesh's
"dp_sp" dim) it is one rank's gradient.

Generation never runs sequence-parallel: outside the context the hooks pass the call
through and the attention is the model's own. State: per model, the installed
`SequenceParallel` (its hooks, `model._hybridflow_sp`); per thread, the models whose
forwards split now, those whose output stays local, and each one's pending end
(`_LOCAL`).
"""
from __future__ import annotations

import threading
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass

import torch
import torch.distributed as dist

from hybridflow.workers.parallel.ulysses import (INNER, SequenceSplit, inner_attention_name,
                                                 register_ulysses)

__all__ = ["SequenceParallel", "LocalSlice", "sequence_parallel", "splitting",
           "local_output", "gather_sequence", "check_model"]

_LOCAL = threading.local()


def _active() -> set:
    if not hasattr(_LOCAL, "models"):
        _LOCAL.models, _LOCAL.pending, _LOCAL.local = set(), {}, {}
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


class _SumShards(torch.autograd.Function):
    """All-reduce (sum) of values each rank filled at its own positions (zeros at the
    others'); every rank then computes the same loss from the sum, so the backward hands
    each rank the sum's gradient as it is: its own positions' part reaches its values."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group) -> torch.Tensor:
        x = x.clone()
        dist.all_reduce(x, group=group)
        return x

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad, None


@dataclass(frozen=True)
class LocalSlice:
    """The positions one rank's forward held: [start, start + width) of the row padded
    to `padded`, whose first `length` positions are the caller's."""
    group: object
    sp: int
    rank: int
    start: int
    width: int
    length: int
    padded: int

    def combine(self, values: torch.Tensor, index: torch.Tensor, total: int) -> torch.Tensor:
        """[n, ...] values of this rank's positions, at places `index` [n] among `total`
        -> [total, ...] on every rank of the sp group (every place filled by one rank)."""
        whole = values.new_zeros((total,) + tuple(values.shape[1:]))
        return _SumShards.apply(whole.index_put((index,), values), self.group)


@contextmanager
def local_output(model):
    """Within the block, a splitting forward of `model` returns this rank's slice of the
    output (no gather); the yielded list receives each such forward's `LocalSlice`.
    Outside a sequence-parallel pass (or at sp=1) the list stays empty."""
    _active()
    inner = getattr(model, "module", model)  # the hooks sit on a DDP wrapper's module
    seen: list[LocalSlice] = []
    _LOCAL.local[id(inner)] = seen
    try:
        yield seen
    finally:
        _LOCAL.local.pop(id(inner), None)


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
        where = LocalSlice(self.group, self.sp, self.rank, part.start, width, length, padded)
        _LOCAL.pending[id(model)] = (where, keep)
        return (), kwargs

    def _gather(self, model, args, output):
        pending = _LOCAL.pending.pop(id(model), None) if hasattr(_LOCAL, "pending") else None
        if pending is None:
            return None
        where, keep = pending
        local = _LOCAL.local.get(id(model))
        if local is not None:  # the caller reduces this rank's positions itself
            local.append(where)
            return None
        output.logits = _whole_sequence(output.logits, where, keep)
        return output


def _whole_sequence(logits, where: LocalSlice, keep):
    """A slice's logits [b, s/sp, V] gathered along the sequence over the sp group, cut
    to the caller's length and `logits_to_keep`. A tensor-parallel head's logits (a
    DTensor sharded on the vocabulary over tp) gather their local shard, the vocabulary
    shard staying put, and come back a DTensor of the same placements."""
    from hybridflow.core.dtensor import is_sharded, local_shard
    local = local_shard(logits)  # differentiable: the DTensor's gradient reaches it
    whole = gather_sequence(local, where.group, where.sp, where.rank)[:, :where.length]
    if isinstance(keep, int) and keep > 0:
        whole = whole[:, -keep:]
    elif torch.is_tensor(keep):
        whole = whole[:, keep]
    if not is_sharded(logits):
        return whole
    from torch.distributed.tensor import DTensor
    shape = whole.shape[:-1] + logits.shape[-1:]  # the vocabulary may split unevenly
    whole = whole.contiguous()
    return DTensor.from_local(whole, logits.device_mesh, logits.placements, run_check=False,
                              shape=shape, stride=torch.empty(shape, device="meta").stride())


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
        raise ValueError(f"{where}: the model of role '{role}' asks for attn_implementation="
                         f"{inner!r} (its config.json), which sequence parallelism cannot "
                         f"wrap; use a model whose config names one of {list(INNER)} or "
                         "none (sdpa), or set sp=1")
