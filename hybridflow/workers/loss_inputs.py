"""What a graph's loss receives besides the micro-batch: `loss(micro, out)`.

`out` holds the model's outputs on the micro-batch, computed on first use and kept
for the rest of the call (one forward however many terms read them), and the
mini-batch's global counts, so that a loss normalised by them gives each micro-batch
and rank its share of the whole mini-batch's loss (see `training.py`):

- `out.tokens`, `out.seqs`: valid tokens / non-empty sequences of the mini-batch,
  summed over data-parallel ranks (0-dim float64 tensors);
- `out.mean(x, mask=None)`: `sum(x * mask) / tokens`, the token-mean share of this
  micro-batch; the loss's masked mean, and the way to report a metric, since the
  trainer sums metric values over micro-batches and ranks;
- `out.share`: this micro-batch's fraction of the mini-batch's tokens;
- `out.policy_version`: the version of the weights this call trains, i.e. the actor
  updates applied to them before it (0 in the first step, restored on resume): what a
  loss whose terms follow a schedule reads instead of counting its own calls. The
  rows' `policy_version` column is the version that sampled each (behind this one by
  up to `trainer.staleness`). None in a critic's loss (the critic has no version);
- `out.mask`: the training mask those counts are over: `loss_mask` in an agent
  batch (the model's tokens, not the environment's observations), else
  `response_mask` (the caller picks it with `sequences.training_mask_key`). A loss
  masks with `out.mask`, never with a column of `micro` directly.

Policy outputs: `logits` [B, R, V] (float32, over the sampling temperature),
`log_probs` [B, R] of `responses`, `entropy(grad=True)` [B, R]. Value outputs:
`values` [B, R]. With `packed=True` (`model.use_remove_padding`, `packing.py`) the
forward runs on the micro-batch packed into one row; log-probs and entropy are
computed on the response tokens' logits only and unpacked to [B, R] (0 where no
response token is attended); `logits` is unpacked to [B, R, V] only if a loss reads it.
With `logprob_chunk` (`actor.logprob_chunk`, `chunked_logprobs.py`) chunking a
micro-batch, `log_probs` and `entropy` come from one chunked pass over the head's
input, which never holds the micro-batch's logits, in the forward or the backward;
`logits` then applies the head to every position (a loss that reads them holds them).
In a sequence-parallel pass (`parallel/sequence_parallel.py`) `log_probs` and `entropy`
come from the head applied to this rank's slice of the positions (chunked as the
setting says, by the slice's positions), summed over the sp ranks into [B, R]; `logits`
is then summed whole the same way (only a loss that reads it holds it).
"""
from __future__ import annotations

from functools import cached_property

import torch

from hybridflow.core.batch import Batch
from hybridflow.workers.chunked_logprobs import chunk_positions, output_head
from hybridflow.workers.packing import PackedRows, packed_logits
from hybridflow.workers.sequences import (ResponseHidden, entropy_from_logits, head_path,
                                          head_stats, response_hidden, response_logits,
                                          response_positions, response_values, token_logprobs)
from hybridflow.workers.parallel.vocab_parallel import whole

__all__ = ["LossInputs", "PolicyOutputs", "ValueOutputs", "run_loss", "select_for_loss",
           "with_current", "worker_default_loss"]


class LossInputs:
    """The global counts of the mini-batch and the loss mask of this micro-batch."""

    def __init__(self, model, micro: Batch, tokens, seqs, mask_key: str,
                 policy_version: int | None = None):
        self.model, self.micro = model, micro
        self.tokens, self.seqs = tokens, seqs
        self.mask = micro[mask_key]
        self.policy_version = policy_version

    def mean(self, values: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        mask = self.mask if mask is None else mask
        kept = torch.where(mask.bool(), values, torch.zeros_like(values))
        return kept.sum() / torch.as_tensor(self.tokens, dtype=values.dtype,
                                            device=values.device).clamp(min=1)

    @property
    def share(self) -> torch.Tensor:
        return self.mask.sum() / self.tokens.clamp(min=1)


class PolicyOutputs(LossInputs):
    def __init__(self, model, micro: Batch, tokens, seqs, mask_key: str = "response_mask",
                 temperature: float = 1.0, packed: bool = False,
                 policy_version: int | None = None, logprob_chunk: int | None = None):
        super().__init__(model, micro, tokens, seqs, mask_key, policy_version)
        self.temperature = temperature
        self._rows = PackedRows(micro) if packed else None
        self._entropy: dict[bool, torch.Tensor] = {}
        self._setting = logprob_chunk
        # a sequence-parallel forward reduces its own slice's positions (head_path),
        # chunked or not: from the head's input, as a chunked forward is
        self._split = head_path(model)
        self._chunk = None if self._split else chunk_positions(
            logprob_chunk, model, response_positions(micro, self._rows))

    @property
    def _from_hidden(self) -> bool:
        return self._split or self._chunk is not None

    @cached_property
    def _token_logits(self) -> torch.Tensor:
        """[B, R, V], or packed [K, V] (the response tokens' positions only)."""
        if self._from_hidden:  # a loss reading `logits`: the head over every position
            part = self._hidden
            logits = output_head(self.model)(part.hidden).float()
            logits = logits / self.temperature if self.temperature != 1.0 else logits
            logits = part.whole(logits)
            return logits if self._rows is not None else \
                logits.view(*self.micro["responses"].shape, -1)
        if self._rows is None:
            return response_logits(self.model, self.micro, self.temperature)
        return packed_logits(self.model, self._rows, self.temperature)

    @cached_property
    def _hidden(self) -> ResponseHidden:
        """The head's input and the tokens (this rank's slice under sp): the one forward."""
        return response_hidden(self.model, self.micro, self._rows)

    @cached_property
    def _stats(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Log-probs and entropy (with gradient) from the head's input, [B, R] each."""
        log_probs, entropy = head_stats(self.model, self._hidden, self._setting,
                                        self.temperature, True)
        if self._rows is None:
            shape = self.micro["responses"].shape
            return log_probs.view(shape), entropy.view(shape)
        return self._rows.unpack(log_probs), self._rows.unpack(entropy)

    def _unpacked(self, values: torch.Tensor) -> torch.Tensor:
        return values if self._rows is None else self._rows.unpack(values)

    @cached_property
    def logits(self) -> torch.Tensor:
        # whole-vocabulary logits for a loss that reads them (gathered under tp)
        return self._unpacked(whole(self._token_logits))

    @cached_property
    def log_probs(self) -> torch.Tensor:
        if self._from_hidden:
            return self._stats[0]
        tokens = self.micro["responses"] if self._rows is None else self._rows.tokens
        return self._unpacked(token_logprobs(self._token_logits, tokens))

    def entropy(self, grad: bool = True) -> torch.Tensor:
        """Per-token entropy; `grad=False` for a metric (no backward memory).
        The shared forward (`_token_logits`) is computed before grad is switched
        off, so a metric read first never strips the graph from `log_probs`."""
        if self._from_hidden:
            entropy = self._stats[1]
            return entropy if grad else entropy.detach()
        if grad not in self._entropy:
            logits = self._token_logits
            with torch.set_grad_enabled(grad and torch.is_grad_enabled()):
                logits = logits if grad else logits.detach()
                self._entropy[grad] = self._unpacked(entropy_from_logits(logits))
        return self._entropy[grad]


class ValueOutputs(LossInputs):
    def __init__(self, model, micro: Batch, tokens, seqs, mask_key: str = "response_mask",
                 packed: bool = False):
        super().__init__(model, micro, tokens, seqs, mask_key)
        self.packed = packed

    @cached_property
    def values(self) -> torch.Tensor:
        return response_values(self.model, self.micro, self.packed)


LOSS_CONTRACT = ("the loss is a 0-dim float tensor computed from out's outputs (out.log_probs, "
                 "out.entropy(), out.values, ...) so that it has a gradient, the metrics a dict "
                 "of name -> float or 0-dim tensor")


def run_loss(loss, micro: Batch, out: LossInputs,
             current: dict[str, str] | None = None) -> tuple[torch.Tensor, dict]:
    """Call a graph's loss and check what it returned against the contract, naming
    the loss and stating the contract on every violation (TypeError/ValueError).
    `current`: key -> output of `out` (e.g. "old_log_probs" -> "log_probs") that the
    micro-batch gets, detached, before the loss reads it (`with_current`)."""
    result = loss(with_current(micro, out, current) if current else micro, out)
    problem = _loss_problem(result)
    if problem:
        name = getattr(loss, "__name__", type(loss).__name__)
        raise TypeError(f"loss {name!r} must return (loss, metrics): it {problem}; "
                        f"{LOSS_CONTRACT} (docs/workers.md#losses)")
    return result


def with_current(micro: Batch, out: LossInputs, current: dict[str, str]) -> Batch:
    """`micro` with each key of `current` set to the named output of `out`, detached:
    the value a node computing it with these weights would have written. The forward
    is the one the loss runs anyway (outputs are cached), so it costs no extra pass.
    Equal to that node's output only before the method's first optimizer step: the
    caller refuses more than one step (`Trainer.train(one_step=...)`)."""
    filled = micro.select(*micro.keys())
    for key, output in current.items():
        filled[key] = getattr(out, output).detach()
    return filled


def _loss_problem(result) -> str | None:
    """What is wrong with a loss's return value, or None."""
    if not (isinstance(result, tuple) and len(result) == 2):
        return f"returned {_kind(result)}, not a (loss, metrics) pair"
    value, metrics = result
    if not torch.is_tensor(value):
        return f"returned a loss of {_kind(value)}, not a tensor"
    if value.dim() != 0:
        return (f"returned a loss of shape {list(value.shape)}, not a scalar (reduce it, "
                "e.g. out.mean(x))")
    if not value.is_floating_point():
        return f"returned a loss of dtype {value.dtype}, not a float"
    if torch.is_grad_enabled() and not value.requires_grad:
        return ("returned a loss with no gradient (it was computed without out's outputs, "
                "under torch.no_grad(), or from .detach()ed values)")
    if not isinstance(metrics, dict):
        return f"returned metrics of {_kind(metrics)}, not a dict"
    return None


def _kind(value) -> str:
    if isinstance(value, tuple):
        return f"a tuple of {len(value)}"
    return f"type {type(value).__name__}"


def select_for_loss(batch: Batch, model_reads: tuple[str, ...], loss, where: str,
                    computed: tuple[str, ...] = ()) -> Batch:
    """The columns a training call needs: the model's inputs and the loss's keys
    (less `computed`: keys the call fills from its own forward, `with_current`).
    KeyError naming the loss and the missing keys (a graph built without the
    compiler's check, or a default loss whose keys depend on config)."""
    from hybridflow.graph.loss import loss_spec
    if not len(batch):
        return batch
    spec = loss_spec(loss)
    reads = tuple(k for k in (spec.reads if spec else ()) if k not in computed)
    missing = [k for k in model_reads + reads if k not in batch]
    if missing:
        name = spec.name if spec else getattr(loss, "__name__", type(loss).__name__)
        raise KeyError(f"{where}: loss {name!r} reads {missing}, which the call's input "
                       f"lacks; add the node that writes it to the call's inputs (e.g. "
                       f"ref.logprob for 'ref_log_prob')")
    optional = [k for k in (spec.optional if spec else ()) if k in batch]
    return batch.select(*dict.fromkeys(model_reads + reads + tuple(optional)))


def worker_default_loss(worker, target: str, settings):
    """`target`'s registered default loss, built once per worker from its config section."""
    from hybridflow.graph.loss import default_loss
    built = worker.__dict__.setdefault("_default_losses", {})
    if target not in built:
        built[target] = default_loss(target, settings)
    return built[target]
