"""Losses chosen by the graph: the `@loss_fn` declaration and the default losses.

A training method (`actor.update`, `critic.update`, `actor.sft`) owns the loop
(epochs, mini-batches, micro-batches, data parallelism, the optimizer); the graph
passes the math as an argument::

    g.call("actor.update", rollout, old, adv, loss=ops.policy_loss(cfg.actor))

A loss is a callable `loss(micro, out) -> (loss, metrics)` declared with
`@loss_fn(reads=...)`: `micro` is the micro-batch (the keys it declared, plus the
model inputs), `out` the model's outputs on it (`out.log_probs`, `out.entropy()`,
`out.logits`, `out.values`) and the mini-batch's global counts (`out.tokens`,
`out.seqs`, `out.mean(x)`); see `hybridflow/workers/loss_inputs.py`. The compiler
adds the declared keys to the node's reads, so a missing key fails before launch.

State: `DEFAULT_LOSSES`, the default loss factory of each training method
(`"actor.update" -> factory(section config) -> loss`), filled by the modules that
hold the math (`graphs/ops.py` registers today's config-chosen losses) on import.
The engine ships no loss and imports no algorithm: a call without `loss=` gets
`default_loss(target, settings)`, which imports `DEFAULT_LOSS_PROVIDERS` by name
when nothing is registered yet (e.g. in a fresh Ray worker process).
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Callable

from hybridflow.graph.dispatch import keys_of

__all__ = ["LossSpec", "loss_fn", "loss_spec", "takes_loss", "call_keys",
           "register_default_loss", "default_loss", "DEFAULT_LOSS_PROVIDERS"]

_LOSS_ATTR = "__hybridflow_loss__"
_SLOT_ATTR = "__hybridflow_loss_slot__"
DEFAULT_LOSS_PROVIDERS: list[str] = ["graphs.ops"]
DEFAULT_LOSSES: dict[str, Callable[[Any], Callable]] = {}


@dataclass(frozen=True)
class LossSpec:
    """A loss's contract: keys it needs in the micro-batch, keys it uses if present."""
    name: str
    reads: tuple[str, ...] = ()
    optional: tuple[str, ...] = ()


def loss_fn(*, reads=(), optional=()):
    """Declare a loss `fn(micro, out) -> (loss, metrics)` and the batch keys it reads.

    Works on functions and on instances (call it on `self` in `__init__` when the
    keys depend on settings, e.g. a KL term that reads `ref_log_prob`)."""
    def wrap(fn):
        name = getattr(fn, "__name__", type(fn).__name__)
        setattr(fn, _LOSS_ATTR, LossSpec(name, keys_of(reads), keys_of(optional)))
        return fn
    return wrap


def loss_spec(loss) -> LossSpec | None:
    return getattr(loss, _LOSS_ATTR, None)


@dataclass(frozen=True)
class LossSlot:
    """A training method's loss argument: its name and the keys the method itself
    reads whatever the loss (the model's inputs)."""
    param: str
    model_reads: tuple[str, ...]


def takes_loss(*, model_reads, param: str = "loss"):
    """Mark a worker method whose `param` argument is a loss; stack with `@method`,
    whose reads/optional stay the keys of the method's default loss."""
    def wrap(fn):
        setattr(fn, _SLOT_ATTR, LossSlot(param, keys_of(model_reads)))
        return fn
    return wrap


def call_keys(method_fn, reads: tuple[str, ...], optional: tuple[str, ...],
              kwargs: dict) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The (reads, optional) of a call node: the method's own, or, when the graph
    passes a loss, the method's model inputs plus the loss's declared keys.
    ValueError when the argument is not a declared loss."""
    slot: LossSlot | None = getattr(method_fn, _SLOT_ATTR, None)
    if slot is None or kwargs.get(slot.param) is None:
        return reads, optional
    loss = kwargs[slot.param]
    spec = loss_spec(loss)
    if spec is None:
        raise ValueError(f"argument {slot.param}={loss!r} is not a declared loss: decorate it "
                         "with @loss_fn(reads=...) from hybridflow (see docs/algorithms.md)")
    merged = tuple(dict.fromkeys(slot.model_reads + spec.reads))
    return merged, tuple(k for k in spec.optional if k not in merged)


def register_default_loss(target: str, factory: Callable[[Any], Callable]) -> None:
    """`factory(section_config) -> loss` serves calls of `target` ("actor.update")
    made without a `loss=` argument."""
    DEFAULT_LOSSES[target] = factory


def default_loss(target: str, settings) -> Callable:
    """The default loss of `target`, built from the method's config section."""
    if target not in DEFAULT_LOSSES:
        for module in DEFAULT_LOSS_PROVIDERS:
            importlib.import_module(module)
    if target not in DEFAULT_LOSSES:
        raise ValueError(f"{target} was called without a loss and no default loss is "
                         f"registered for it (providers: {DEFAULT_LOSS_PROVIDERS}); pass "
                         f"loss=... to the node")
    return DEFAULT_LOSSES[target](settings)
