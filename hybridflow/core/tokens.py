"""Per-token reductions shared by the workers, the graphs' function nodes and the RL math in
`algorithms/`: masked sum/mean/variance, the training mask, entropy from logits.

`mask` is 1 where a token counts, 0 where it is padding (or, for an agent rollout's
`loss_mask`, an observation/tool token). Values at masked positions are selected away,
not multiplied, so a padded position holding inf or nan cannot poison a sum. Stateless.
"""
from __future__ import annotations

import torch

__all__ = ["masked_sum", "masked_mean", "masked_var", "training_mask_key", "training_mask",
           "entropy_from_logits"]


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


def training_mask_key(batch) -> str:
    """`"loss_mask"` when `batch` (a Batch or a dict of tensors) carries a loss mask
    over its responses, else `"response_mask"`."""
    mask = batch.get("loss_mask")
    width_of = batch.get("responses", batch.get("response_mask"))
    if mask is not None and width_of is not None and mask.shape == width_of.shape:
        return "loss_mask"
    return "response_mask"


def training_mask(batch) -> torch.Tensor:
    """The tokens a loss, an advantage, a KL or a per-token metric counts."""
    return batch[training_mask_key(batch)]


def entropy_from_logits(logits: torch.Tensor, chunk_size: int = 2048) -> torch.Tensor:
    """Entropy of softmax(logits) along the last dim: [..., V] -> [...].

    `logsumexp(x) - sum(softmax(x) * x)`, stable for large logits (no exp of
    raw values). Rows are processed `chunk_size` at a time so the [rows, V]
    probabilities of a long batch never exist all at once; half precision is
    upcast to float32. Logits must be finite.
    """
    flat = logits.reshape(-1, logits.shape[-1])
    parts = []
    for chunk in flat.split(chunk_size):
        if chunk.dtype in (torch.float16, torch.bfloat16):
            chunk = chunk.float()
        probs = torch.softmax(chunk, dim=-1)
        parts.append(torch.logsumexp(chunk, dim=-1) - (probs * chunk).sum(dim=-1))
    if not parts:
        return flat.new_zeros(logits.shape[:-1],
                              dtype=torch.promote_types(flat.dtype, torch.float32))
    return torch.cat(parts).reshape(logits.shape[:-1])
