"""Pinning a worker process to CPU cores (`placement.pools.<name>.cores`, Ray only).

A pool that lists cores gives each worker of a node an equal slice of them, in
local-rank order (`cores_for`); the worker, before its roles are built, moves every
thread it has to that slice and sizes torch's thread pool to it (`pin_process`), so
two pools on one machine overlap on the hardware's cores rather than on the OS
scheduler's choice. The check that the cores exist runs in the worker, on its own
node: the driver's machine may not be the worker's. Stateless: the affinity lives in
the process's threads.
"""
from __future__ import annotations

import os

__all__ = ["cores_for", "pin_process", "thread_affinities"]


def cores_for(cores: tuple[int, ...], devices_per_node: int, local_rank: int) -> tuple[int, ...]:
    """The slice of a pool's `cores` that its worker of `local_rank` runs on."""
    width = len(cores) // devices_per_node
    return tuple(cores[local_rank * width:(local_rank + 1) * width])


def pin_process(cores: tuple[int, ...], key: str, torch_threads: int | None) -> list[int]:
    """Run this process's threads (those alive now and, through the calling thread,
    those it starts later) on `cores`; torch gets `torch_threads` threads, or one per
    core when None. A core this process may not use is a ValueError naming `key`."""
    allowed = os.sched_getaffinity(0)
    missing = sorted(set(cores) - allowed)
    if missing:
        raise ValueError(
            f"{key}={list(cores)}: core(s) {missing} are not among the cores this worker "
            f"may use on its node ({_ranges(allowed)}); list cores of that set, or drop "
            f"the key to let the OS place the workers")
    for tid in _threads():
        try:
            os.sched_setaffinity(tid, cores)
        except (ProcessLookupError, PermissionError):  # a thread that just ended
            continue
    import torch
    torch.set_num_threads(torch_threads or len(cores))
    return sorted(os.sched_getaffinity(0))


def thread_affinities() -> dict[int, list[int]]:
    """Every thread of this process and the cores it may run on (what a test reads)."""
    out = {}
    for tid in _threads():
        try:
            out[tid] = sorted(os.sched_getaffinity(tid))
        except ProcessLookupError:
            continue
    return out


def _threads() -> list[int]:
    try:
        return [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:  # no /proc: the calling thread only
        return [0]


def _ranges(cores) -> str:
    """{0, 1, 2, 5} -> '0-2,5'."""
    out, ids = [], sorted(cores)
    start = prev = ids[0]
    for c in ids[1:] + [None]:
        if c is not None and c == prev + 1:
            prev = c
            continue
        out.append(str(start) if start == prev else f"{start}-{prev}")
        if c is not None:
            start = prev = c
    return ",".join(out)
