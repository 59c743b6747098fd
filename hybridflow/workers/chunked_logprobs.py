"""Log-probs and entropy of response tokens computed a chunk of positions at a time,
so that the full-vocabulary logits of a long row never exist at once.

The model runs as usual up to its output head (`get_output_embeddings()`, `lm_head`);
a forward pre-hook takes the head's input (the final hidden states at the positions
that predict response tokens: `logits_to_keep` already selected them) and hands the
head one position of it instead, so the model's own logits are `[.., 1, V]`. The head is
then applied to `chunk` positions at a time, and each chunk is reduced to its tokens'
log-probs and entropy ([chunk] each) before the next chunk's logits exist:

    hidden [N, H] --split--> [chunk, H] --head--> [chunk, V] --> log p, H  [chunk]

A plain linear head (`head_logprobs.fused_head`) goes through `head_logprobs.py`'s
autograd Function: the forward keeps no logits, only the hidden states and a
logsumexp and entropy per position, and the backward recomputes each chunk's logits
once and forms their gradient analytically (one head matmul more than the whole-logits
path, no autograd graph over the vocabulary). Any other head (a tensor-parallel one,
its weight a DTensor sharded on the vocabulary: `parallel/vocab_parallel.py`) runs
each chunk inside `torch.utils.checkpoint` (non-reentrant): its forward keeps only its
[chunk, H] input, and the backward recomputes that chunk's logits, log-softmax and
entropy and runs their autograd backward. Either way the backward holds one chunk's
logits at a time, and the math per position is the unchunked one (the same head, the
same float32 reductions), so results equal the whole-row computation up to the
matmul's rounding.

Chunking is what `chunk_positions` decides from the role's `logprob_chunk` setting:
0 never, a positive number that many positions, None (the default) as many as keep a
chunk's float32 logits under `AUTO_CHUNK_ELEMENTS`; a micro-batch with no more
positions than one chunk takes the unchunked path unchanged. Models whose forward
transforms the head's output (soft-capping, a logit scale) keep the unchunked path:
the head alone would not reproduce their logits. Stateless.
"""
from __future__ import annotations

from contextlib import contextmanager

import torch
from torch.utils.checkpoint import checkpoint

from hybridflow.workers.config import AUTO_LOGPROB_CHUNK_ELEMENTS, logprob_chunk_positions
from hybridflow.workers.head_logprobs import fused_head, head_token_stats
from hybridflow.workers.parallel.vocab_parallel import entropy_from_logits, token_logprobs

__all__ = ["AUTO_CHUNK_ELEMENTS", "chunk_positions", "output_head", "head_input",
           "chunked_token_stats"]

# 2**24 float32 = 64 MiB of logits per chunk by default (a 49k vocabulary: 341
# positions; 152k: 110); the toy's 80-token vocabulary never chunks
AUTO_CHUNK_ELEMENTS = AUTO_LOGPROB_CHUNK_ELEMENTS
# config attributes of Hugging Face models whose forward rescales the head's output
_HEAD_TRANSFORMS = ("final_logit_softcapping", "logit_scale", "logits_scaling")


def _unwrapped(model):
    """The model under a DistributedDataParallel wrapper (FSDP2 and TP keep the class)."""
    from torch.nn.parallel import DistributedDataParallel
    return model.module if isinstance(model, DistributedDataParallel) else model


def output_head(model):
    """The model's output head when chunking can replace it, else None (no head, or a
    forward that transforms the head's logits)."""
    inner = _unwrapped(model)
    getter = getattr(inner, "get_output_embeddings", None)
    head = getter() if getter is not None else None
    config = getattr(inner, "config", None)
    if head is None or not isinstance(getattr(head, "weight", None), torch.Tensor):
        return None
    if any(getattr(config, name, None) not in (None, 1, 1.0) for name in _HEAD_TRANSFORMS):
        return None
    return head


def chunk_positions(setting: int | None, model, positions: int) -> int | None:
    """Positions per chunk for a forward over `positions` positions (in a
    sequence-parallel pass, those of this rank's slice), or None for the unchunked path
    (`setting` 0, a model `output_head` refuses, or one chunk's worth)."""
    if setting == 0 or positions <= 1:
        return None
    head = output_head(model)
    if head is None:
        return None
    chunk = logprob_chunk_positions(setting, head.weight.shape[0])
    return chunk if positions > chunk else None


@contextmanager
def head_input(model):
    """Within the block, the model's forward hands its head one position and the yielded
    list receives the head's real input (the hidden states)."""
    head, seen = output_head(model), []

    def take(module, args, kwargs):
        hidden = args[0] if args else kwargs.pop("input")
        seen.append(hidden)
        # one position, not none: a DTensor head cannot reshape an empty batch
        return (hidden[..., :1, :],) + tuple(args[1:]), kwargs

    # prepend: before a tensor-parallel plan's input hook turns it into a DTensor
    handle = head.register_forward_pre_hook(take, prepend=True, with_kwargs=True)
    try:
        yield seen
    finally:
        handle.remove()


def _chunk_stats(head, hidden, tokens, temperature: float, with_entropy: bool):
    # the unchunked path's ops, on `hidden`'s positions only (sequences.response_logits)
    logits = head(hidden).float()
    if temperature != 1.0:
        logits = logits / temperature
    log_probs = token_logprobs(logits, tokens)
    if not with_entropy:
        return log_probs, None
    return log_probs, entropy_from_logits(logits)


def chunked_token_stats(head, hidden: torch.Tensor, tokens: torch.Tensor, chunk: int,
                        temperature: float = 1.0, with_entropy: bool = False
                        ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-prob of `tokens` [N] and (if asked) the entropy [N] from `hidden` [N, H],
    `chunk` positions at a time; differentiable with one chunk's logits recomputed at a
    time in the backward."""
    if fused_head(head):
        return head_token_stats(head, hidden, tokens, chunk, temperature, with_entropy)
    grad = torch.is_grad_enabled()
    parts = []
    for piece, ids in zip(hidden.split(chunk), tokens.split(chunk)):
        if grad:
            parts.append(checkpoint(_chunk_stats, head, piece, ids, temperature, with_entropy,
                                    use_reentrant=False))
        else:
            parts.append(_chunk_stats(head, piece, ids, temperature, with_entropy))
    log_probs = torch.cat([p[0] for p in parts])
    entropy = torch.cat([p[1] for p in parts]) if with_entropy else None
    return log_probs, entropy
