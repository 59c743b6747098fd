"""Token log-probs and entropy of a linear output head, a chunk of positions at a time,
with a hand-written backward that recomputes each chunk's logits once and no autograd
graph over the vocabulary (the chunked path of `chunked_logprobs.py`).

For hidden states h [N, D], the head's weight W [V, D] (and bias b [V]), the sampling
temperature T and the tokens y [N], per position:

    z = (h W^T + b) / T            lse = logsumexp(z)        log p = z - lse
    log p(y) = z_y - lse           H = lse - sum softmax(z) * z

The forward keeps h, W, b, y, lse and H ([N] each), never the logits. The backward,
given dL/dlog p(y) = g and (when the entropy is a loss term) dL/dH = e, recomputes a
chunk's z once and forms the gradient with respect to the logits analytically:

    dL/dz = g (onehot(y) - p) - e p (log p + H)      p = softmax(z)

then dL/d(hW^T + b) = dL/dz / T, grad_h = G W, grad_W += G^T h, grad_b += sum G: one head
matmul recomputed per chunk (where `torch.utils.checkpoint` ran the head, the
log-softmax and the entropy forward again and then their autograd backward). An
entropy read only as a metric gets no gradient (`e` is None) and costs nothing in the
backward.

Precision follows the autograd path it replaces: the head's matmuls run in the
autocast dtype when the forward ran under autocast (else in the weight's), the
reductions in float32, gradients are returned in h's and W's own dtypes. Applies to
a plain `nn.Linear` head with plain-tensor weights (`fused_head` decides); a
tensor-parallel head (a DTensor weight sharded on the vocabulary) keeps the
checkpointed path. Stateless.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["fused_head", "head_token_stats"]

_HALF = (torch.float16, torch.bfloat16)  # upcast to float32 for the reductions


def fused_head(head) -> bool:
    """Whether `head_token_stats` reproduces `head(x)`: a plain `nn.Linear` (no subclass
    forward such as LoRA's, no hooks) whose weight is a plain tensor (not a DTensor)."""
    if not isinstance(head, torch.nn.Linear) or type(head).forward is not torch.nn.Linear.forward:
        return False
    if head._forward_hooks or head._forward_pre_hooks:
        return False
    params = [head.weight] + ([head.bias] if head.bias is not None else [])
    return all(type(p) in (torch.Tensor, torch.nn.Parameter) for p in params)


def _compute_dtype(hidden: torch.Tensor, weight: torch.Tensor) -> torch.dtype:
    """The dtype `head(hidden)` computes in here: autocast's, else the weight's."""
    kind = hidden.device.type
    if torch.is_autocast_enabled(kind) and weight.is_floating_point():
        return torch.get_autocast_dtype(kind)
    return weight.dtype


def _logits(hidden, weight, bias, temperature: float) -> torch.Tensor:
    """Float32 logits over the temperature of one chunk (inputs already in the compute
    dtype); a fresh tensor the caller may overwrite."""
    logits = F.linear(hidden, weight, bias)
    logits = logits.float() if logits.dtype in _HALF else logits
    return logits.div_(temperature) if temperature != 1.0 else logits


def _forward(hidden, weight, bias, tokens, chunk: int, temperature: float,
             with_entropy: bool):
    """(log p(y) [N], lse [N], H [N] or None), one chunk's logits at a time."""
    log_probs, lses, entropies = [], [], []
    for start in range(0, hidden.shape[0], chunk):
        z = _logits(hidden[start:start + chunk], weight, bias, temperature)
        ids = tokens[start:start + chunk]
        lse = torch.logsumexp(z, dim=-1)
        log_probs.append(z.gather(-1, ids.unsqueeze(-1)).squeeze(-1) - lse)
        lses.append(lse)
        if with_entropy:  # lse - sum p z, p = exp(z - lse), as core.tokens' entropy
            p = (z - lse.unsqueeze(-1)).exp_()
            entropies.append(lse - p.mul_(z).sum(-1))
    entropy = torch.cat(entropies) if with_entropy else None
    return torch.cat(log_probs), torch.cat(lses), entropy


def _logit_grad(z, lse, entropy, ids, grad_logp, grad_ent):
    """dL/dz of one chunk, computed in place of its recomputed logits z (float32)."""
    log_p = z.sub_(lse.unsqueeze(-1))                 # z is not needed after this
    if grad_ent is None:       # g (onehot(y) - p), in one buffer
        grad = log_p.exp_().mul_(-grad_logp.unsqueeze(-1))
    else:                      # - e p (log p + H) [- g p], in log_p's buffer
        p = log_p.exp()
        grad = log_p.add_(entropy.unsqueeze(-1)).mul_(p).mul_(-grad_ent.unsqueeze(-1))
        if grad_logp is not None:
            grad.sub_(p.mul_(grad_logp.unsqueeze(-1)))
    if grad_logp is not None:
        grad.scatter_add_(-1, ids.unsqueeze(-1), grad_logp.unsqueeze(-1))
    return grad


class _HeadTokenStats(torch.autograd.Function):
    """`head_token_stats` under autograd (see the module docstring)."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, tokens, chunk, temperature, with_entropy):
        dtype = _compute_dtype(hidden, weight)
        kind = hidden.device.type
        with torch.autocast(kind, enabled=False):
            cast = [t.to(dtype) if t is not None else None for t in (hidden, weight, bias)]
            log_probs, lse, entropy = _forward(*cast, tokens, chunk, temperature,
                                               with_entropy)
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(hidden, weight, bias, tokens, lse, entropy)
        ctx.chunk, ctx.temperature, ctx.dtype = chunk, temperature, dtype
        return log_probs, entropy

    @staticmethod
    def backward(ctx, grad_logp, grad_ent):
        hidden, weight, bias, tokens, lse, entropy = ctx.saved_tensors
        if grad_logp is None and grad_ent is None:
            return (None,) * 7
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        dtype, chunk = ctx.dtype, ctx.chunk
        with torch.autocast(hidden.device.type, enabled=False):
            h, w = hidden.to(dtype), weight.to(dtype)
            b = bias.to(dtype) if bias is not None else None
            grad_h = torch.empty_like(hidden) if need_h else None
            grad_w = _zeros(weight) if need_w else None
            grad_b = _zeros(bias) if need_b else None
            # dL/d(h W^T + b) = dL/dz / T: the 1/T folded into the [N] upstream gradients
            grad_logp, grad_ent = (_over(g, ctx.temperature) for g in (grad_logp, grad_ent))
            for start in range(0, hidden.shape[0], chunk):
                part = slice(start, start + chunk)
                g = _logit_grad(_logits(h[part], w, b, ctx.temperature), lse[part],
                                entropy[part] if entropy is not None else None,
                                tokens[part], _part(grad_logp, part), _part(grad_ent, part))
                g = g.to(dtype) if dtype in _HALF else g
                if need_h:
                    grad_h[part] = g @ w
                if need_w:
                    _accumulate(grad_w, g.t(), h[part])
                if need_b:
                    grad_b += g.sum(0, dtype=grad_b.dtype)
        return (grad_h, _as(grad_w, weight), _as(grad_b, bias), None, None, None, None)


def _over(grad, temperature: float):
    return grad / temperature if grad is not None and temperature != 1.0 else grad


def _part(grad, part):
    return grad[part] if grad is not None else None


def _zeros(param: torch.Tensor) -> torch.Tensor:
    """A gradient accumulator: float32 for a half-precision parameter, else its dtype."""
    dtype = torch.float32 if param.dtype in _HALF else param.dtype
    return torch.zeros(param.shape, dtype=dtype, device=param.device)


def _accumulate(total: torch.Tensor, left: torch.Tensor, right: torch.Tensor) -> None:
    """total += left @ right; in place when the product has `total`'s dtype."""
    if left.dtype == total.dtype:
        total.addmm_(left, right)
    else:
        total += left @ right


def _as(grad, like):
    return grad.to(like.dtype) if grad is not None and grad.dtype != like.dtype else grad


def head_token_stats(head: torch.nn.Linear, hidden: torch.Tensor, tokens: torch.Tensor,
                     chunk: int, temperature: float = 1.0, with_entropy: bool = False
                     ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-prob of `tokens` [N] and (if asked) the entropy [N] of `head`'s softmax over
    `temperature` at `hidden` [N, D], `chunk` positions of logits at a time, in the
    forward and the backward (`fused_head(head)` must hold)."""
    if not torch.is_grad_enabled():
        dtype = _compute_dtype(hidden, head.weight)
        cast = [t.to(dtype) if t is not None else None
                for t in (hidden, head.weight, head.bias)]
        with torch.autocast(hidden.device.type, enabled=False):
            log_probs, _, entropy = _forward(*cast, tokens, chunk, temperature, with_entropy)
        return log_probs, entropy
    return _HeadTokenStats.apply(hidden, head.weight, head.bias, tokens, chunk,
                                 temperature, with_entropy)
