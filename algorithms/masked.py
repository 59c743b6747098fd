"""Masked reductions over [B, T] tensors, shared by advantages, losses and KL.

`mask` is the response mask: 1 where a token is real, 0 where it is padding.
Values at masked positions are ignored (selected away, not multiplied), so a
padded position holding inf or nan cannot poison a sum.
"""
from __future__ import annotations

import torch


def masked_sum(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Sum of `values` where `mask` is 1; over all elements, or along `dim`."""
    kept = torch.where(mask.bool(), values, torch.zeros_like(values))
    return kept.sum() if dim is None else kept.sum(dim=dim)


def masked_mean(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean of `values` where `mask` is 1; 0 where nothing is valid (not nan)."""
    count = mask.sum() if dim is None else mask.sum(dim=dim)
    # clamp(min=1): an empty selection has sum 0, so its mean is 0, and the
    # result stays attached to the graph (gradient 0 rather than nan).
    return masked_sum(values, mask, dim) / count.clamp(min=1).to(values.dtype)


def masked_var(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Unbiased (Bessel-corrected, n / (n - 1)) variance over valid elements.

    Raises ValueError with fewer than two valid elements: the unbiased
    variance is undefined there, and a silent 0 would blow up a whitening.
    """
    n = int(mask.sum().item())
    if n < 2:
        raise ValueError(
            f"unbiased masked variance needs at least 2 valid tokens, got {n}; "
            "check the response mask (all responses empty or a single token?)"
        )
    mean = masked_mean(values, mask)
    variance = masked_mean((values - mean) ** 2, mask)
    return variance * (n / (n - 1))
