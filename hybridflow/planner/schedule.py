"""Simulate one step: nodes start when their inputs are done and their pool is free.

Nodes of one pool run one after another in the graph's topological order;
pools run concurrently; driver nodes (sources, functions, rule roles) need no
pool and start as soon as their inputs are ready.
"""
from __future__ import annotations

from dataclasses import dataclass

from .problem import NodeInfo

DRIVER = -1  # pool index of nodes that run on the driver


@dataclass(frozen=True)
class NodeTiming:
    node: str
    pool: str | None
    start: float
    end: float

    @property
    def seconds(self) -> float:
        return self.end - self.start


class StepSchedule:
    """A graph compiled to index arrays, so simulating a plan is one tight loop."""

    def __init__(self, nodes: tuple[NodeInfo, ...], pool_of_role: dict[str, int], pools: int):
        index = {n.name: i for i, n in enumerate(nodes)}
        self.nodes = nodes
        self.pools = pools
        self.pool = [pool_of_role.get(n.role, DRIVER) if n.role else DRIVER for n in nodes]
        self.deps = [tuple(index[d] for d in n.deps) for n in nodes]

    def makespan(self, seconds: list[float]) -> float:
        end = [0.0] * len(self.nodes)
        free = [0.0] * self.pools
        for i, deps in enumerate(self.deps):
            start = max((end[d] for d in deps), default=0.0)
            pool = self.pool[i]
            if pool != DRIVER:
                start = max(start, free[pool])
                free[pool] = start + seconds[i]
            end[i] = start + seconds[i]
        return max(end, default=0.0)

    def lower_bound(self, seconds: list[float], busy: list[float]) -> float:
        """A bound on the makespan from lower bounds on node times and on each pool's busy time.

        The step lasts at least its longest dependency chain, and each pool
        finishes no earlier than its first node can start plus its busy time.
        """
        end = [0.0] * len(self.nodes)
        first_start = [float("inf")] * self.pools
        for i, deps in enumerate(self.deps):
            start = max((end[d] for d in deps), default=0.0)
            end[i] = start + seconds[i]
            pool = self.pool[i]
            if pool != DRIVER and start < first_start[pool]:
                first_start[pool] = start
        bound = max(end, default=0.0)
        for pool, least_busy in enumerate(busy):
            bound = max(bound, first_start[pool] + least_busy)
        return bound

    def timings(self, seconds: list[float],
                pool_names: list[str]) -> tuple[dict[str, NodeTiming], list[str]]:
        """Start and end of every node, and the critical path from first to last node."""
        end = [0.0] * len(self.nodes)
        start = [0.0] * len(self.nodes)
        free = [0.0] * self.pools
        last_on_pool = [-1] * self.pools
        waits_on = [-1] * len(self.nodes)  # the node whose end fixed this node's start
        for i, deps in enumerate(self.deps):
            ready = max(deps, key=lambda d: end[d], default=-1)
            start[i], waits_on[i] = (end[ready], ready) if ready >= 0 else (0.0, -1)
            pool = self.pool[i]
            if pool != DRIVER:
                if free[pool] > start[i]:
                    start[i], waits_on[i] = free[pool], last_on_pool[pool]
                free[pool] = start[i] + seconds[i]
                last_on_pool[pool] = i
            end[i] = start[i] + seconds[i]
        out = {}
        for i, node in enumerate(self.nodes):
            pool = self.pool[i]
            out[node.name] = NodeTiming(node.name, None if pool == DRIVER else pool_names[pool],
                                        start[i], end[i])
        path, i = [], max(range(len(end)), key=end.__getitem__) if end else -1
        while i >= 0:
            path.append(self.nodes[i].name)
            i = waits_on[i]
        return out, path[::-1]
