"""CPU accounting on a shared machine: what a process used, and how many cores two
processes get at once right now. Stateless."""
from __future__ import annotations

import os
import time

__all__ = ["process_cpu_s", "machine_parallelism"]


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process on this machine (0 once it has gone)."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _spin(n: int) -> float:
    start = time.perf_counter()
    total = 0
    for i in range(n):
        total += i * i
    return time.perf_counter() - start


def machine_parallelism(n: int = 2_000_000) -> float:
    """How many cores two CPU-bound processes got at once, right now: 2 x (one spin
    alone) / (two spins together, the slower). 2.0 on two idle cores; what other jobs
    on a shared machine leave bounds what any overlap of two workers can gain."""
    import multiprocessing
    pool = multiprocessing.get_context("fork").Pool(2)
    try:
        pool.map(_spin, [n // 10] * 2)  # both processes started
        alone = pool.apply(_spin, (n,))
        together = max(pool.map(_spin, [n, n], chunksize=1))
    finally:  # let them exit (terminate's SIGTERM makes Ray's inherited handler print)
        pool.close()
        pool.join()
    return 2 * alone / together
