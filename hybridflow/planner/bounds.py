"""Lower bounds on the step time of partly chosen allocations.

Search fixes pool sizes one group at a time; a group whose size is not yet
chosen can still take any allowed size up to the devices left. For each group
this table holds, per allowed size, the fastest time of each of its nodes and
its least busy time over the pool's Pareto layouts, and the same minima over
all sizes up to each size (prefix minima). From these, `StepSchedule.lower_bound`
gives a bound valid for every completion, so a whole subtree of allocations
whose bound cannot beat the best found is skipped.
"""
from __future__ import annotations

import bisect

from .pool import PoolEval, Shortfall

INF = float("inf")


class GroupBounds:
    """Node-time and busy-time minima of one group of roles over pool sizes."""

    def __init__(self, node_ids: list[int], node_names: list[str], sizes: list[int],
                 options: list[list[PoolEval] | Shortfall]):
        self.node_ids = node_ids
        self.sizes = sizes
        self.exact = [self._minima(node_names, opts) for opts in options]
        self.prefix = []
        best_nodes, best_busy = [INF] * len(node_names), INF
        for nodes, busy in self.exact:
            best_nodes = [min(a, b) for a, b in zip(best_nodes, nodes)]
            best_busy = min(best_busy, busy)
            self.prefix.append((best_nodes, best_busy))

    @staticmethod
    def _minima(names: list[str], opts) -> tuple[list[float], float]:
        if isinstance(opts, Shortfall):
            return [INF] * len(names), INF
        fastest = [min(ev.node_seconds[n] for ev in opts) for n in names]
        return fastest, min(ev.busy_seconds for ev in opts)

    def at(self, size: int) -> tuple[list[float], float]:
        return self.exact[self.sizes.index(size)]

    def up_to(self, cap: int) -> tuple[list[float], float]:
        index = bisect.bisect_right(self.sizes, cap) - 1
        return self.prefix[index] if index >= 0 else ([INF] * len(self.node_ids), INF)


def partial_bound(schedule, base_times: list[float], tables: list[GroupBounds],
                  chosen: tuple[int, ...], cap: int) -> float:
    """Bound for allocations starting with sizes `chosen`; later groups get at most `cap`
    devices."""
    times = list(base_times)
    busy = []
    for index, table in enumerate(tables):
        values, least_busy = table.at(chosen[index]) if index < len(chosen) else table.up_to(cap)
        if least_busy == INF:
            return INF
        for node, seconds in zip(table.node_ids, values):
            times[node] = seconds
        busy.append(least_busy)
    return schedule.lower_bound(times, busy)
