"""The rollout engine protocol and the registry of engines by name.

An engine turns prompt rows into responses with the weights it holds, and knows
which policy version those weights are (`policy_version`: how many actor updates
they have seen). A new backend is one module that defines a factory
`factory(spec: EngineSpec) -> engine` plus one `register_engine(name, factory)`;
`rollout.backend=<name>` then selects it for both the actor's own engine and the
`rollout` role (`rollout.backend="package.module:factory"` imports and registers
it in every process, which Ray workers need).

What an engine can do is declared at registration, as a worker method declares its
dispatch, never probed on the object: `streams=True` (its engines implement
`StreamingEngine`: `trainer.async_mode=streaming`) and `tensor_parallel=True` (they
generate on a tp group of ranks). A factory named by import path declares the same
as attributes of the factory (`factory.streams = True`; a class attribute when the
factory is the engine class). The compiler reads the declarations before any worker
starts (`engine_streams`, passed to plan/streaming_split.py); `make_engine` checks
that a streaming engine has every member of `StreamingEngine`.

State: `_ENGINES`, name -> factory, and the declarations `_STREAMING`,
`_TENSOR_PARALLEL` (sets of names), filled when `hybridflow.workers.rollout` is
imported (the built-in `hf` and `vllm`) and by `register_engine` calls; read by
`make_engine` and the readers below. Nothing else changes them.
"""
from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Protocol, runtime_checkable

import torch

from hybridflow.core.batch import Batch

__all__ = ["RolloutEngine", "StreamingEngine", "EngineSpec", "register_engine", "make_engine",
           "engine_names", "engine_supports_tp", "engine_streams", "streaming_engines",
           "check_engine_name", "check_streaming", "STREAMING_MEMBERS", "UNKNOWN_VERSION",
           "engine_pins_cores", "check_tp_cores"]

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

    @property
    def group_tp(self) -> int:
        """The tensor-parallel size asked for: `tp`, else the role's (`ctx.tp`), >= 1."""
        tp = self.tp if self.tp is not None else getattr(self.ctx, "tp", 1)
        return max(1, int(tp or 1))


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
    flight across weight updates. An engine registered with `streams=True` has every
    member (checked by `make_engine`), so callers use them without probing.

    submit: rows already repeated n times, queued (one request per row) with `opts`
    (the same options for every call of one stream); returns how many.
    poll(max_steps): up to `max_steps` decode steps, each with the weights held at
    that moment (a `load_weights` + `finish_weight_update(version)` between two polls
    lands while requests are in flight; `opts.partial` says whether they continue
    with the new weights or restart); returns the finished rows (the engine columns,
    the prompt's columns and `STREAM_COLUMNS`: `policy_version` = the version of the
    response's oldest token, `token_versions` [B, R] per token, -1 on padding) or None.
    abort: drop every request not finished; returns how many.
    stream_busy: requests queued or in flight.
    stream_counts: the engine's counters since it was built (`async/stream/*`: decode
    steps, restarts, ...; {} before the first submit).
    tp: how many ranks form this engine (1, or the tp group generating together: the
    ranks of a group are given the same prompts and one of them reports).
    """
    tp: int

    def submit(self, prompts: Batch, opts) -> int: ...

    def poll(self, max_steps: int) -> Batch | None: ...

    def abort(self) -> int: ...

    stream_busy: bool

    def stream_counts(self) -> dict: ...


STREAMING_MEMBERS = ("submit", "poll", "abort", "stream_busy", "stream_counts", "tp")
_CALLABLE = ("submit", "poll", "abort", "stream_counts")

_ENGINES: dict[str, Callable[[EngineSpec], RolloutEngine]] = {}
_STREAMING: set[str] = set()  # declared streams=True: their engines are StreamingEngines
_TENSOR_PARALLEL: set[str] = set()  # engines that generate on a tp group of ranks


def register_engine(name: str, factory: Callable[[EngineSpec], RolloutEngine],
                    replace: bool = False, streams: bool = False,
                    tensor_parallel: bool = False) -> None:
    """Make `rollout.backend=<name>` build engines with `factory(spec)`; `streams`:
    its engines implement `StreamingEngine` (`trainer.async_mode=streaming`);
    `tensor_parallel`: its engines generate with the role's tp group of ranks
    (`placement.parallel.<role>.tp > 1`). The compiler and preflight read both before
    any worker starts."""
    if name in _ENGINES and not replace:
        raise ValueError(f"rollout engine {name!r} is already registered; pass "
                         "replace=True to override it")
    for flag, value in (("streams", streams), ("tensor_parallel", tensor_parallel)):
        if not isinstance(value, bool):
            raise TypeError(f"register_engine({name!r}, ...): {flag} must be True or False, "
                            f"not {value!r}")
    _ENGINES[name] = factory
    (_STREAMING.add if streams else _STREAMING.discard)(name)
    (_TENSOR_PARALLEL.add if tensor_parallel else _TENSOR_PARALLEL.discard)(name)


def engine_supports_tp(name: str) -> bool:
    """Whether the engine registered as `name` generates tensor-parallel."""
    return name in _TENSOR_PARALLEL


def engine_pins_cores(name: str) -> bool:
    """Whether the engine registered as `name` pins each rank of a tp group to CPU cores
    of its own (declared on the factory: `factory.pins_cores = True`, as `vllm` does)."""
    return bool(getattr(_ENGINES.get(name), "pins_cores", False))


def check_tp_cores(key: str, tp: int, cores, engine: str) -> None:
    """ValueError naming `key`, `tp` and the usable `cores` when the `tp` ranks of a group
    cannot each run on a core of their own: what preflight (`check` and `run`, before
    launch) and the engine's build in the worker both call, with the cores a worker
    process may run on."""
    cores = sorted(cores)
    if tp > len(cores):
        raise ValueError(
            f"{key}={tp}: rollout.backend={engine!r} pins each rank of a tp group to CPU "
            f"cores of its own, and a worker process here may run on {len(cores)} core(s) "
            f"({cores}); use tp <= {len(cores)} here")


def engine_streams(name: str) -> bool:
    """Whether `rollout.backend=<name>` declares streaming (a 'package.module:factory'
    name is imported and registered first, reading its factory's declaration)."""
    check_engine_name(name)
    return name in _STREAMING


def streaming_engines() -> list[str]:
    """The registered engines that declare streaming, sorted."""
    return sorted(_STREAMING)


def _not_declared(backend: str, engine=None) -> str:
    what = f" ({type(engine).__name__})" if engine is not None else ""
    return (f"trainer.async_mode=streaming: rollout.backend={backend!r}{what} does not "
            f"declare streaming (engines that stream: "
            f"{', '.join(streaming_engines()) or 'none'}); set rollout.backend to one of "
            f"those or trainer.async_mode=pipeline, or, if the engine implements "
            f"StreamingEngine ({', '.join(STREAMING_MEMBERS)}), declare it: "
            f"register_engine(name, factory, streams=True), or `streams = True` on a "
            f"'package.module:factory' factory")


def check_streaming(engine, backend: str) -> None:
    """A clear error when `backend` (whose engine is `engine`) does not declare
    streaming; a declared one was checked against `StreamingEngine` when built."""
    if backend not in _STREAMING:
        raise TypeError(_not_declared(backend, engine))


def engine_names() -> list[str]:
    return sorted(_ENGINES)


def _import_factory(name: str) -> None:
    """`rollout.backend="package.module:factory"` registers that factory under that
    name in each process that needs it (Ray workers do not run the driver's
    `register_engine` calls)."""
    from hybridflow.core.names import resolve_name
    factory = resolve_name(name, "rollout.backend", ValueError, "an engine factory")
    register_engine(name, factory, replace=True, streams=_declared(factory, name, "streams"),
                    tensor_parallel=_declared(factory, name, "tensor_parallel"))


def _declared(factory, name: str, flag: str) -> bool:
    """A factory's own declaration `factory.<flag> = True` (absent: False)."""
    value = getattr(factory, flag, False)  # the declaration, read as dispatch's is
    if not isinstance(value, bool):
        raise ValueError(f"rollout.backend={name!r}: the factory's `{flag}` declaration "
                         f"must be True or False, not {value!r}")
    return value


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
    if name in _STREAMING:
        _check_declared_streaming(engine, name)
    return engine


def _check_declared_streaming(engine, name: str) -> None:
    """An engine registered with streams=True has every StreamingEngine member: the
    declaration is verified once here, so its users call them without probing."""
    missing = [m for m in STREAMING_MEMBERS if not hasattr(engine, m)
               or (m in _CALLABLE and not callable(getattr(engine, m)))]
    if missing:
        raise TypeError(f"rollout engine {name!r} ({type(engine).__name__}) is registered "
                        f"with streams=True but lacks {missing} of the StreamingEngine "
                        f"protocol (hybridflow/workers/rollout/engine.py); implement them, "
                        f"or register it without streams=True (trainer.async_mode=pipeline)")
