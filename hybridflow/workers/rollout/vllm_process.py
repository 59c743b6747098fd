"""What building and running a vLLM engine in this process changes, and the engine
owning it, so a run's training is the same whether or not an engine was built.

vLLM 0.32, in-process (`external_launcher`, the engine core in this process), was
seen to (each confirmed by running it on the CPU build):
- rewrite ~20 environment variables (LD_PRELOAD, MASTER_PORT, RANK, VLLM_*, ...);
- reseed the global RNGs (`set_random_seed(seed)`) and, when sampling, draw from
  them;
- replace `torch.set_num_threads` with a no-op (the CPU worker, after binding its
  OpenMP threads) and move the process's CPU affinity;
- create torch.distributed's default group when none exists, and destroy it, with
  vLLM's own parallel groups, when *any* engine shuts down (a surviving engine
  then fails);
- bind `MASTER_PORT` for that default group: a fixed port makes two engines in two
  processes collide (EADDRINUSE).

`VLLMProcessState` snapshots the process before the first build and swaps between
the trainer's state and vLLM's around every call into vLLM (`entered()`): the
environment, the RNG states (vLLM keeps its own stream, seeded by its seed), the
thread count and `torch.set_num_threads`, the CPU affinity. `_SESSION` counts the
live engines of this process and whether vLLM created the default group, so that
only the last engine's shutdown tears vLLM's distributed state down, and never a
group the trainer created.

State: `_SESSION` (live engine count, whether vLLM owns the default group).
"""
from __future__ import annotations

import contextlib
import os
import random
import socket
import weakref

import numpy as np
import torch

__all__ = ["VLLMProcessState", "PROCESS_STATE", "free_port", "rank_env", "own_shutdown",
           "live_engines", "note_build_start"]

_SESSION = {"live": 0, "owns_default_group": False}


def free_port() -> int:
    """A TCP port free now (the OS picks it): one per engine's default group."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def rank_env(device: torch.device) -> dict[str, str]:
    """The torch.distributed env `external_launcher` reads. With the trainer's default
    group (data-parallel ranks), vLLM joins it: this rank in that world (every rank
    generates on its own, vLLM's "external DP"). Without one, vLLM creates a world of
    one on a free port (never a fixed one: another process's engine may hold it)."""
    import torch.distributed as dist
    local = str(device.index or 0)
    if dist.is_available() and dist.is_initialized():
        return {"RANK": str(dist.get_rank()), "WORLD_SIZE": str(dist.get_world_size()),
                "LOCAL_RANK": local, "MASTER_ADDR": os.environ.get("MASTER_ADDR", "127.0.0.1"),
                "MASTER_PORT": os.environ.get("MASTER_PORT", str(free_port()))}
    return {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": local, "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(free_port())}


def _rng_state() -> tuple:
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None
    return random.getstate(), np.random.get_state(), torch.get_rng_state(), cuda


def _set_rng_state(state: tuple) -> None:
    py, npy, cpu, cuda = state
    random.setstate(py)
    np.random.set_state(npy)
    torch.set_rng_state(cpu)
    if cuda is not None and torch.cuda.is_initialized():
        torch.cuda.set_rng_state_all(cuda)


def _affinity():
    return os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None


def _set_env(env: dict) -> None:
    for key in [k for k in os.environ if k not in env]:
        del os.environ[key]
    for key, value in env.items():
        if os.environ.get(key) != value:
            os.environ[key] = value


class _Snapshot:
    """One side's process state: env, RNGs, threads, set_num_threads, affinity."""

    def __init__(self):
        self.env = dict(os.environ)
        self.rng = _rng_state()
        self.threads = torch.get_num_threads()
        self.set_num_threads = torch.set_num_threads
        self.affinity = _affinity()

    def restore(self) -> None:
        _set_env(self.env)
        _set_rng_state(self.rng)
        torch.set_num_threads = self.set_num_threads
        if torch.get_num_threads() != self.threads:
            self.set_num_threads(self.threads)
        if self.affinity is not None and _affinity() != self.affinity:
            os.sched_setaffinity(0, self.affinity)


class VLLMProcessState:
    """The trainer's process state and vLLM's, swapped around each call into vLLM
    (importing it included: the import sets env vars too).

    `entered(extra_env)`: inside, the process is as vLLM last left it (the trainer's
    state the first time) plus `extra_env`; outside, as the trainer had it."""

    def __init__(self):
        self.vllm: _Snapshot | None = None

    @contextlib.contextmanager
    def entered(self, extra_env: dict | None = None):
        trainer = _Snapshot()
        if self.vllm is not None:
            self.vllm.restore()
        os.environ.update(extra_env or {})
        try:
            yield
        finally:
            self.vllm = _Snapshot()
            trainer.restore()


PROCESS_STATE = VLLMProcessState()  # one per process: vLLM's globals are per process


def live_engines() -> int:
    return _SESSION["live"]


def note_build_start() -> None:
    """Before a build: whether vLLM is about to create the default group itself."""
    import torch.distributed as dist
    if _SESSION["live"] == 0:
        _SESSION["owns_default_group"] = not (dist.is_available() and dist.is_initialized())


def _shutdown(core, state: VLLMProcessState) -> None:
    """Shut one engine core down; vLLM's distributed teardown (default group and its
    parallel groups, shared by every engine of the process) only with the last one,
    and only when vLLM created the default group."""
    import vllm.v1.engine.core as core_module
    _SESSION["live"] -= 1
    teardown = core_module.cleanup_dist_env_and_memory
    last = _SESSION["live"] == 0 and _SESSION["owns_default_group"]
    if not last:
        core_module.cleanup_dist_env_and_memory = lambda *a, **k: None
    try:
        with state.entered():
            core.shutdown()
    finally:
        core_module.cleanup_dist_env_and_memory = teardown


def own_shutdown(owner, llm, state: VLLMProcessState):
    """Take over `llm`'s in-process shutdown (vLLM's finalizer tears down the shared
    distributed state): it now runs when `owner` is collected or its returned
    finalizer is called, through `_shutdown`. Counts the engine as live."""
    client = llm.llm_engine.engine_core  # vLLM's InprocClient: the core runs here
    client._finalizer.detach()
    _SESSION["live"] += 1
    return weakref.finalize(owner, _shutdown, client.engine_core, state)
