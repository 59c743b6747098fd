"""What every role worker shares: its context (rank, device, seed, neighbours) and
checkpoint/weight accounting.

A worker class is constructed as `WorkerClass(cfg, ctx)`: `cfg` is the whole run
config (DictConfig, nested dict or dataclass with sections `model`, `actor`,
`rollout`, `ref`, `critic`, `reward`), of which each worker reads only its own
sections, once, into typed dataclasses. Methods are `m(self, batch, **kwargs) ->
Batch`, returning exactly the declared `writes` keys row-aligned with the input
(plus every input column for `forwards=True`), metrics as floats in
`out.meta["metrics"]`. Every method accepts a 0-row batch.
"""
from __future__ import annotations

import os
import socket
from typing import Any

import torch

from hybridflow.core.batch import Batch
from hybridflow.core.context import WorkerContext
from hybridflow.core.dtensor import local_shard
from hybridflow.core.worker_hooks import WorkerHooks
from hybridflow.workers.models import resolve_device

__all__ = ["WorkerContext", "Worker", "metrics_batch", "storage_bytes", "held_bytes"]


def storage_bytes(tensors) -> dict[int, int]:
    """storage address -> its bytes, each storage once (views and tied weights share one)."""
    out: dict[int, int] = {}
    for t in tensors:
        local = local_shard(t)
        storage = local.untyped_storage()
        out[storage.data_ptr()] = storage.nbytes()
    return out


def held_bytes(reports) -> dict[str, int]:
    """Sum `Worker.held_tensors()` reports into `engine/weight_bytes` and
    `engine/optimizer_bytes`, counting each storage once per process (colocated roles
    live in one process and may share storages, e.g. a reference served by the actor)."""
    metrics = {"engine/weight_bytes": "weights", "engine/optimizer_bytes": "optimizer"}
    seen: dict[str, dict] = {name: {} for name in metrics}
    for report in reports:
        for name, kind in metrics.items():
            for ptr, nbytes in report[kind].items():
                seen[name][(report["process"], ptr)] = nbytes
    return {name: sum(storages.values()) for name, storages in seen.items()}


def metrics_batch(batch: Batch, metrics: dict[str, float]) -> Batch:
    batch.meta = {**batch.meta, "metrics": {k: float(v) for k, v in metrics.items()}}
    return batch


class Worker(WorkerHooks):
    """Base of the role workers: context, device, and checkpoint plumbing; the
    optional hooks the engine reads (`HOST_ROLE`, `served_by`, ...) are declared, with
    their defaults, by `hybridflow.core.worker_hooks.WorkerHooks`.

    Subclasses set `self.module` (the model) and, when they train, `self.trainer`
    (a `hybridflow.workers.training.Trainer`).
    """
    module: torch.nn.Module | None = None
    trainer = None

    def __init__(self, cfg, ctx: WorkerContext | None = None):
        self.ctx = ctx or WorkerContext()
        self.cfg = cfg  # trained roles call ctx.init_distributed(); inference roles need
        # no process group, so a runtime may simulate their ranks in one process

    def _device(self, spec: str) -> torch.device:
        return resolve_device(spec, self.ctx.device, self.ctx.local_rank)

    # ---------------------------------------------------------------- weights
    def held_tensors(self) -> dict[str, Any]:
        """The storages this worker holds, for the run's memory metrics: model weights
        (parameters and buffers) and optimizer state, keyed by storage address so that
        `held_bytes` counts a storage shared by colocated roles once."""
        weights = storage_bytes(list(self.module.parameters()) + list(self.module.buffers())) \
            if self.module is not None else {}
        optimizer = getattr(self.trainer, "optimizer", None)
        state = [t for s in optimizer.state.values() for t in s.values()
                 if isinstance(t, torch.Tensor)] if optimizer is not None else []
        return {"process": f"{socket.gethostname()}:{os.getpid()}", "weights": weights,
                "optimizer": storage_bytes(state)}

    def save_checkpoint(self, directory: str) -> None:
        """A trained role: weights and optimizer sharded per rank (DCP,
        `parallel/sharded_checkpoint.py`); an inference role: rank 0's safetensors weights."""
        if self.trainer is not None:
            from hybridflow.workers.parallel.sharded_checkpoint import save_trainer
            save_trainer(self.trainer, directory, self.ctx.rank, getattr(self, "tokenizer", None))
        elif self.module is not None and self.ctx.rank == 0:
            from hybridflow.workers.training import save_weights
            save_weights(self.module, directory)
        save_rng(directory, self.ctx.rank)

    def save_process_rng(self, directory: str) -> None:
        """Only this process's generators: for a process that hosts no trained role
        (a rollout on its own pool samples from them)."""
        save_rng(directory, self.ctx.rank)

    def load_process_rng(self, directory: str) -> None:
        load_rng(directory, self.ctx.rank)

    def load_checkpoint(self, directory: str) -> None:
        if self.trainer is not None:
            from hybridflow.workers.parallel.sharded_checkpoint import load_trainer
            load_trainer(self.trainer, directory, self.ctx.rank, self.trainer.world)
        elif self.module is not None:
            from hybridflow.workers.training import load_weights
            load_weights(self.module, directory)
        load_rng(directory, self.ctx.rank)


def _rng_file(directory: str, rank: int) -> str:
    return os.path.join(directory, f"rng_rank{rank}.safetensors")


def save_rng(directory: str, rank: int) -> None:
    """This process's torch generators (sampling in generate draws from them), so a
    resumed run samples what an uninterrupted one would, on any runtime."""
    from safetensors.torch import save_file
    os.makedirs(directory, exist_ok=True)
    states = {"cpu": torch.get_rng_state()}
    if torch.cuda.is_available():
        states["cuda"] = torch.cuda.get_rng_state()
    save_file(states, _rng_file(directory, rank))


def load_rng(directory: str, rank: int) -> None:
    from hybridflow.core.loading import read_safetensors
    path = _rng_file(directory, rank)
    if not os.path.lexists(path):  # checkpoints from before generators were saved
        return
    states = read_safetensors(path, "checkpoint RNG state")
    torch.set_rng_state(states["cpu"])
    if "cuda" in states and torch.cuda.is_available():
        torch.cuda.set_rng_state(states["cuda"])
