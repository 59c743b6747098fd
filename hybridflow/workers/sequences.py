"""Sequence layout shared by the workers, and the response log-prob forward.

A rollout row is `[left-padded prompt | right-padded response]`: `input_ids` and
`attention_mask` are [B, P + R], `responses` and `response_mask` are [B, R]. The
logit that predicts response token t sits at position P + t - 1, so the response
slice of the logits is `[:, -R - 1:-1]`.
"""
from __future__ import annotations

import torch

from hybridflow.batch import Batch

__all__ = ["position_ids_from_mask", "response_mask_from_ids", "pad_right",
           "forward_response", "response_logprobs"]

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


def forward_response(model, batch: Batch, temperature: float = 1.0,
                     with_entropy: bool = False, entropy_grad: bool = True,
                     ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-token log-prob of `responses` [B, R] (float32), and the entropy if asked
    (detached unless `entropy_grad`: a metric costs no backward memory)."""
    responses = batch["responses"]
    width = responses.shape[1]
    logits = _logits(model, batch, width + 1)[:, :-1].float()
    if temperature != 1.0:
        logits = logits / temperature
    chosen = torch.gather(logits, -1, responses.unsqueeze(-1)).squeeze(-1)
    log_probs = chosen - torch.logsumexp(logits, dim=-1)
    entropy = None
    if with_entropy:
        from algorithms.losses import entropy_from_logits
        with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
            entropy = entropy_from_logits(logits if entropy_grad else logits.detach())
    return log_probs, entropy


@torch.no_grad()
def response_logprobs(model, batch: Batch, micro_batch_size: int, device,
                      temperature: float = 1.0, with_entropy: bool = False):
    """`forward_response` over micro-batches, without gradient; results on CPU."""
    width = batch["responses"].shape[1]
    if len(batch) == 0:
        empty = torch.zeros(0, width, dtype=torch.float32)
        return empty, (empty.clone() if with_entropy else None)
    logps, ents = [], []
    for i in range(0, len(batch), micro_batch_size):
        micro = batch.take(slice(i, i + micro_batch_size)).to(device)
        logp, ent = forward_response(model, micro, temperature, with_entropy)
        logps.append(logp.cpu())
        if ent is not None:
            ents.append(ent.cpu())
    return torch.cat(logps), (torch.cat(ents) if with_entropy else None)
