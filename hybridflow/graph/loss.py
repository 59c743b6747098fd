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

__all__ = ["LossSpec", "LossSlot", "loss_fn", "loss_spec", "takes_loss", "loss_slot",
           "current_keys", "call_keys",
           "register_default_loss", "default_loss", "DEFAULT_LOSS_PROVIDERS"]

_LOSS_ATTR = "__hybridflow_loss__"
_SLOT_ATTR = "__hybridflow_loss_slot__"
DEFAULT_LOSS_PROVIDERS: list[str] = ["hybridflow.graphs.ops"]
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
    reads whatever the loss (the model's inputs).

    `current` maps a key the loss reads to the model output (an attribute of the
    loss's `out`) that equals it, detached, while the method's weights are still
    those the key was computed with: before its first optimizer step. The method's
    `current_param` argument names the keys to take that way (the compiler's
    plan/unneeded.py passes it when it removes the node that wrote them)."""
    param: str
    model_reads: tuple[str, ...]
    current: tuple[tuple[str, str], ...] = ()
    current_param: str = "from_current"


def takes_loss(*, model_reads, param: str = "loss", current: dict | None = None,
               current_param: str = "from_current"):
    """Mark a worker method whose `param` argument is a loss; stack with `@method`,
    whose reads/optional stay the keys of the method's default loss. `current`:
    key -> model output it may be taken from (see `LossSlot`)."""
    def wrap(fn):
        setattr(fn, _SLOT_ATTR, LossSlot(param, keys_of(model_reads),
                                         tuple((current or {}).items()), current_param))
        return fn
    return wrap


def loss_slot(method_fn) -> LossSlot | None:
    """The loss argument a training method declares (`takes_loss`), or None."""
    return getattr(method_fn, _SLOT_ATTR, None)


def current_keys(slot: LossSlot | None, kwargs: dict) -> tuple[str, ...]:
    """The keys a call's `kwargs` ask its method to take from its own forward.
    ValueError naming a key the method cannot take that way."""
    if slot is None or not kwargs.get(slot.current_param):
        return ()
    keys = keys_of(kwargs[slot.current_param])
    known = dict(slot.current)
    unknown = [k for k in keys if k not in known]
    if unknown:
        raise ValueError(f"argument {slot.current_param}={list(keys)}: the method can take "
                         f"only {sorted(known) or 'no keys'} from its own forward, not "
                         f"{unknown}")
    return keys


def call_keys(method_fn, reads: tuple[str, ...], optional: tuple[str, ...],
              kwargs: dict) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The (reads, optional) of a call node: the method's own, or, when the graph
    passes a loss, the method's model inputs plus the loss's declared keys.
    ValueError when the argument is not a declared loss."""
    slot: LossSlot | None = getattr(method_fn, _SLOT_ATTR, None)
    own = current_keys(slot, kwargs)  # the method computes these: not read from upstream
    if slot is None or kwargs.get(slot.param) is None:
        return tuple(k for k in reads if k not in own), optional
    loss = kwargs[slot.param]
    spec = loss_spec(loss)
    if spec is None:
        raise ValueError(f"argument {slot.param}={loss!r} is not a declared loss: decorate it "
                         "with @loss_fn(reads=...) from hybridflow (see docs/algorithms.md)")
    merged = tuple(k for k in dict.fromkeys(slot.model_reads + spec.reads) if k not in own)
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
