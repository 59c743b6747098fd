"""The `runtime` config section's schema: which executor runs the plan and how long it
waits. It lives below both layers that use it: `program/config.py` validates it as part
of the run config, and the executors (`runtime/local.py`, `runtime/ray/pools.py`) read
it, so the runtime never imports the program layer above it."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from hybridflow.core.constraints import above, at_least, checked, one_of
from hybridflow.core.modes import RuntimeName

__all__ = ["RuntimeConfig"]


@dataclass
class RuntimeConfig:
    name: str = checked(RuntimeName.LOCAL.value, one_of(*RuntimeName.names()))
    address: Optional[str] = None       # join an existing Ray cluster
    num_cpus: Optional[int] = checked(None, at_least(1))  # for a Ray instance the run starts
    num_gpus: Optional[int] = checked(None, at_least(0))  # logical GPUs (CPU-only may declare)
    call_timeout_s: float = checked(600.0, above(0))   # a slower worker call is a failure
    start_timeout_s: float = checked(300.0, above(0))  # actor start and model loading (Ray)
    connect_timeout_s: float = checked(30.0, above(0))  # reaching `address` (then Ray's retries)
    listen_all: bool = False            # a Ray the run starts listens on all interfaces
    # None: the local runtime uses the cores this process may use (os.sched_getaffinity),
    # a Ray worker 1 (several share the machine)
    torch_threads: Optional[int] = checked(None, at_least(1))
