"""Log-probs and entropy of logits sharded on the vocabulary (a tensor-parallel head's
output: a DTensor placed `Shard(-1)` on the role's tp mesh), computed from each rank's
shard with all-reduces over the tp group, never materialising whole-vocabulary logits:

    m   = max over the vocabulary          (all-reduce MAX; a constant for autograd)
    s   = sum exp(z - m)                   (all-reduce SUM)
    lse = m + log s
    log p(t) = z_t - lse                   (z_t: all-reduce SUM of the owner's logit)
    H   = lse - sum exp(z - m) * z / s     (all-reduce SUM)

Every rank of the group computes the same loss from these replicated values, so the
sums' backward is the identity (Megatron's reduce-from-model-parallel region): each
rank's shard gets exactly the gradient of the one loss. Plain tensors take the
ordinary path. Stateless.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from hybridflow.core.dtensor import whole_tensor
from hybridflow.core.tokens import entropy_from_logits as _whole_entropy

__all__ = ["is_vocab_sharded", "token_logprobs", "entropy_from_logits", "whole"]


def is_vocab_sharded(logits) -> bool:
    placements = getattr(logits, "placements", None)
    if not placements or len(placements) != 1:
        return False
    shard = placements[0]
    return shard.is_shard() and shard.dim in (-1, logits.dim() - 1)


def whole(logits):
    """Whole-vocabulary logits as a plain tensor (gathered when sharded)."""
    return whole_tensor(logits)


class _SumOverGroup(torch.autograd.Function):
    """All-reduce SUM over the tp group forward; identity backward (see the docstring)."""

    @staticmethod
    def forward(ctx, tensor, group):
        out = tensor.clone()
        dist.all_reduce(out, group=group)
        return out

    @staticmethod
    def backward(ctx, grad):
        return grad, None


def _shard(logits):
    """(local logits, global index of its first vocabulary entry, the tp group)."""
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset
    mesh = logits.device_mesh
    _, offset = compute_local_shape_and_global_offset(logits.shape, mesh, logits.placements)
    return logits.to_local(), offset[-1], mesh.get_group()


def _lse_parts(local: torch.Tensor, group):
    """(max m, exp(local - m), global sum s): the shared pieces of both quantities."""
    peak = local.detach().max(dim=-1, keepdim=True).values
    dist.all_reduce(peak, op=dist.ReduceOp.MAX, group=group)
    exp = torch.exp(local - peak)
    return peak.squeeze(-1), exp, _SumOverGroup.apply(exp.sum(-1), group)


def token_logprobs(logits, tokens: torch.Tensor) -> torch.Tensor:
    """log softmax(logits)[token] per position: [..., V], [...] -> [...]."""
    if not is_vocab_sharded(logits):
        chosen = torch.gather(logits, -1, tokens.unsqueeze(-1)).squeeze(-1)
        return chosen - torch.logsumexp(logits, dim=-1)
    local, start, group = _shard(logits)
    peak, _, total = _lse_parts(local, group)
    owned = (tokens >= start) & (tokens < start + local.shape[-1])
    index = (tokens - start).clamp(0, local.shape[-1] - 1)
    picked = torch.gather(local, -1, index.unsqueeze(-1)).squeeze(-1)
    chosen = _SumOverGroup.apply(torch.where(owned, picked, torch.zeros_like(picked)), group)
    return chosen - (peak + torch.log(total))


def entropy_from_logits(logits) -> torch.Tensor:
    """Entropy of softmax(logits) over the vocabulary: [..., V] -> [...]."""
    if not is_vocab_sharded(logits):
        return _whole_entropy(logits)
    local, _, group = _shard(logits)
    if local.dtype in (torch.float16, torch.bfloat16):
        local = local.float()
    peak, exp, total = _lse_parts(local, group)
    weighted = _SumOverGroup.apply((exp * local).sum(-1), group)
    return peak + torch.log(total) - weighted / total
