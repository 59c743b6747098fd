"""The rollout engine protocol and the registry of engines by name.

An engine turns prompt rows into responses with the weights it holds, and knows
which policy version those weights are (`policy_version`: how many actor updates
they have seen). A new backend is one module that defines a factory
`factory(spec: EngineSpec) -> engine` plus one `register_engine(name, factory)`;
`rollout.backend=<name>` then selects it for both the actor's own engine and the
`rollout` role (`rollout.backend="package.module:factory"` imports and registers
it in every process, which Ray workers need).

State: `_ENGINES`, name -> factory, filled when `hybridflow.workers.rollout` is
imported (the built-in `hf` and `vllm`) and by `register_engine` calls; read by
`make_engine`. Nothing else changes it.
"""
from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Protocol, runtime_checkable

import torch

from hybridflow.core.batch import Batch

__all__ = ["RolloutEngine", "StreamingEngine", "EngineSpec", "register_engine", "make_engine",
           "engine_names", "engine_supports_tp", "check_engine_name", "check_streaming",
           "UNKNOWN_VERSION"]

UNKNOWN_VERSION = -1  # weights not loaded yet (e.g. a vLLM engine built with dummy weights)


@dataclass
class EngineSpec:
    """What an engine factory receives.

    module: the model to generate with when the engine may share it (the actor's own
    module when colocated: zero copy); None means the engine holds weights of its
    own, built from `model_cfg` with `seed` (bit-identical to the actor's initial
    weights for a model built from a config, equal for one loaded from a path).
    """
    model_cfg: Any                    # workers.config.ModelConfig (not imported: that
    rollout_cfg: Any                  # module checks rollout.backend against this registry)
    tokenizer: Any
    ctx: Any                          # hybridflow.workers.base.WorkerContext
    device: torch.device
    module: torch.nn.Module | None = None
    synced_gpus: bool = False         # FSDP: every rank must run every decoding step
    tp: int | None = None             # tensor-parallel size (None: the role's, ctx.tp):
                                      # ranks g*tp..g*tp+tp-1 of ctx's world are one engine


@runtime_checkable
class RolloutEngine(Protocol):
    """What the actor and the rollout role need from an engine.

    shares_module: True when the engine generates with the module it was given, so
    its weights are the actor's at every moment (no load is ever needed).
    generate: rows already repeated n times -> the columns of `generation.ENGINE_COLUMNS`
    (responses, masks, ids, `rollout_log_probs`), row-aligned, right-padded to
    `opts.max_new_tokens`.
    load_weights: one bucket of (name, tensor) pairs with plain Hugging Face names;
    called once per bucket, then `finish_weight_update(version)`.
    sleep / wake_up: free and reclaim device memory between generations (no-ops
    where the engine has nothing to free).
    """
    policy_version: int
    shares_module: bool

    def generate(self, prompts: Batch, opts) -> Batch: ...  # opts: a RolloutConfig

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None: ...

    def finish_weight_update(self, version: int) -> None: ...

    def sleep(self) -> None: ...

    def wake_up(self) -> None: ...


@runtime_checkable
class StreamingEngine(Protocol):
    """What `trainer.async_mode=streaming` needs beyond `RolloutEngine`: requests in
    flight across weight updates.

    submit: rows already repeated n times, queued (one request per row) with `opts`
    (the same options for every call of one stream); returns how many.
    poll(max_steps): up to `max_steps` decode steps, each with the weights held at
    that moment (a `load_weights` + `finish_weight_update(version)` between two polls
    lands while requests are in flight; `opts.partial` says whether they continue
    with the new weights or restart); returns the finished rows (the engine columns,
    the prompt's columns, `policy_version` = the version of the response's oldest
    token, `token_versions` [B, R] per token, -1 on padding) or None.
    abort: drop every request not finished; returns how many.
    stream_busy: requests queued or in flight.
    """

    def submit(self, prompts: Batch, opts) -> int: ...

    def poll(self, max_steps: int) -> Batch | None: ...

    def abort(self) -> int: ...

    stream_busy: bool


def check_streaming(engine, backend: str) -> None:
    """A clear error when `engine` cannot stream (submit / poll / abort)."""
    missing = [m for m in ("submit", "poll", "abort") if not callable(getattr(engine, m, None))]
    if missing:
        raise TypeError(f"trainer.async_mode=streaming needs a rollout engine with submit / "
                        f"poll / abort; rollout.backend={backend!r} ({type(engine).__name__}) "
                        f"lacks {missing}; use rollout.backend=hf or "
                        f"trainer.async_mode=pipeline")


_ENGINES: dict[str, Callable[[EngineSpec], RolloutEngine]] = {}
_STREAMING: set[str] = set()  # engines whose objects have submit / poll / abort
_TENSOR_PARALLEL: set[str] = set()  # engines that generate on a tp group of ranks


def register_engine(name: str, factory: Callable[[EngineSpec], RolloutEngine],
                    replace: bool = False, streams: bool = False,
                    tensor_parallel: bool = False) -> None:
    """Make `rollout.backend=<name>` build engines with `factory(spec)`; `streams`:
    its engines implement submit / poll / abort (`trainer.async_mode=streaming`);
    `tensor_parallel`: its engines generate with the role's tp group of ranks
    (`placement.parallel.<role>.tp > 1`). Preflight reads both before any worker starts."""
    if name in _ENGINES and not replace:
        raise ValueError(f"rollout engine {name!r} is already registered; pass "
                         "replace=True to override it")
    _ENGINES[name] = factory
    (_STREAMING.add if streams else _STREAMING.discard)(name)
    (_TENSOR_PARALLEL.add if tensor_parallel else _TENSOR_PARALLEL.discard)(name)


def engine_supports_tp(name: str) -> bool:
    """Whether the engine registered as `name` generates tensor-parallel."""
    return name in _TENSOR_PARALLEL


def refuse_unstreamable(backend: str) -> None:
    """Before launch: a ValueError when `trainer.async_mode=streaming` names a
    registered engine that does not stream. A 'package.module:factory' engine is
    known only once built: the worker checks it then (check_streaming)."""
    if backend in _ENGINES and backend not in _STREAMING:
        able = ", ".join(sorted(_STREAMING)) or "none"
        raise ValueError(f"trainer.async_mode=streaming: rollout.backend={backend!r} cannot "
                         f"stream (no submit / poll / abort; engines that stream: {able}); "
                         f"set rollout.backend to one of those, or trainer.async_mode=pipeline")


def engine_names() -> list[str]:
    return sorted(_ENGINES)


def _import_factory(name: str) -> None:
    """`rollout.backend="package.module:factory"` registers that factory under that
    name in each process that needs it (Ray workers do not run the driver's
    `register_engine` calls)."""
    from hybridflow.core.names import resolve_name
    factory = resolve_name(name, "rollout.backend", ValueError, "an engine factory")
    register_engine(name, factory, replace=True,
                    tensor_parallel=bool(getattr(factory, "tensor_parallel", False)))


def check_engine_name(name: str) -> None:
    """Raise a ValueError naming the registered engines when `name` is not one."""
    if name not in _ENGINES and ":" in name:
        _import_factory(name)
    if name not in _ENGINES:
        close = difflib.get_close_matches(name, list(_ENGINES), n=1, cutoff=0.5)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise ValueError(f"rollout.backend={name!r} is not a known rollout backend{hint} "
                         f"(valid: {', '.join(engine_names())}); register a new engine with "
                         "hybridflow.workers.rollout.register_engine(name, factory) or name "
                         "it as rollout.backend='package.module:factory'")


def make_engine(spec: EngineSpec) -> RolloutEngine:
    name = spec.rollout_cfg.backend
    check_engine_name(name)
    engine = _ENGINES[name](spec)
    missing = [m for m in ("generate", "load_weights", "finish_weight_update", "sleep",
                           "wake_up") if not callable(getattr(engine, m, None))]
    if missing or not hasattr(engine, "policy_version"):
        raise TypeError(f"rollout engine {name!r} ({type(engine).__name__}) lacks "
                        f"{missing or ['policy_version']} of the RolloutEngine protocol")
    return engine
