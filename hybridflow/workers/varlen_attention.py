"""Variable-length attention on the CPU: packed rows attend each to its own tokens.

A packed row (`packing.py`) holds several sequences; flash-attention-2 handles that
with its varlen kernel (cost: the sum of each sequence's length squared), but it
needs a GPU. Under sdpa or eager, transformers instead builds one dense `[T, T]`
block-diagonal mask: attention then costs T^2, more than the padded batch's rows x
width^2 once a few rows are packed together.

`sdpa_varlen` is a Hugging Face attention implementation (registered with
`AttentionInterface`, its mask with `AttentionMaskInterface` as sdpa's) that, when
the call carries `cu_seq_lens_q` (the packed forward passes it: the offsets at which
each sequence starts), runs `scaled_dot_product_attention(is_causal=True)` once per
sequence and concatenates: the varlen cost, on any device. Without `cu_seq_lens_q`
(generation, padded forwards) it is exactly transformers' sdpa, so a module shared
with the rollout generates as before. Models built under `model.use_remove_padding`
with sdpa attention switch to it (`use_varlen_attention`). State: the registration
in transformers' global interfaces (idempotent).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["VARLEN", "register_varlen_attention", "use_varlen_attention", "varlen_sdpa"]

VARLEN = "sdpa_varlen"


def varlen_sdpa(module, query, key, value, attention_mask, dropout: float = 0.0,
                scaling: float | None = None, cu_seq_lens_q: torch.Tensor | None = None,
                **kwargs):
    """Attention per packed sequence ([1, heads, T, dim] in, [1, T, heads, dim] out);
    transformers' sdpa when the call is not packed (or uses a sliding window, which
    the mask expresses and this loop would not)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    if cu_seq_lens_q is None or query.shape[0] != 1 or kwargs.get("sliding_window"):
        return sdpa_attention_forward(module, query, key, value, attention_mask,
                                      dropout=dropout, scaling=scaling, **kwargs)
    gqa = query.shape[1] != key.shape[1]
    bounds = cu_seq_lens_q.tolist()
    parts = [F.scaled_dot_product_attention(
        query[:, :, s:e], key[:, :, s:e], value[:, :, s:e], is_causal=True, scale=scaling,
        dropout_p=dropout if module.training else 0.0, enable_gqa=gqa)
        for s, e in zip(bounds[:-1], bounds[1:]) if e > s]
    return torch.cat(parts, dim=2).transpose(1, 2).contiguous(), None


def register_varlen_attention() -> str:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
    AttentionInterface.register(VARLEN, varlen_sdpa)
    AttentionMaskInterface.register(VARLEN, sdpa_mask)
    return VARLEN


def use_varlen_attention(model) -> bool:
    """Switch a model that uses sdpa to `sdpa_varlen`; True if it did. Other
    implementations are left alone (flash-attention is varlen already; eager keeps
    the dense block mask)."""
    if getattr(model.config, "_attn_implementation", None) != "sdpa":
        return False
    model.set_attn_implementation(register_varlen_attention())
    return True
