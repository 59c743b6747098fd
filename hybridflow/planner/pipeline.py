"""The pipelined step of an async run (`trainer.staleness >= 1`), and the rollout placed apart.

With staleness k the runtime (hybridflow/runtime/run_long/run_scheduler.py) runs, in one pass, the
train side of step t and the rollout side of step t + k: the two sides overlap,
and only a pool's own nodes run one after another. So a step lasts

    max(rollout side alone, train side alone, busiest pool) + weight sync

where a side alone is simulated as a synchronous step of its nodes (a train node
reads the rollout side's outputs from an earlier iteration: those edges vanish),
a pool's busy time sums its nodes on both sides, and the weight sync (only for a
rollout apart) runs once the update and the new batch's generation are done.
The model assumes the runtime packs each pool's nodes without gaps: a bound
reached when each pool's queue never waits for the other side.

A rollout colocated with its host (folded: one module) cannot generate while the
host trains, which the busiest-pool term charges. A rollout apart
(`apart_problem`) holds weights of its own on a pool without its host, keeps its
engine awake (no engine switch, rollout.py) and receives the host's weights after
each update: two planner-made nodes of kind "sync", `weight_export` on the host's
pool and `weight_sync` on the rollout's (costed in rollout.py).

Stateless: schedules are index arrays built once per grouping.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

from hybridflow.core.modes import AsyncMode

from .problem import SYNC_KIND, NodeInfo, Problem
from .schedule import NodeTiming, StepSchedule

EXPORT_NODE, SYNC_NODE = "weight_export", "weight_sync"  # as plan/weight_sync.py names them


@dataclass(frozen=True)
class PipelineStep:
    """The terms of one plan's pipelined step, in seconds."""

    staleness: int
    rollout_side: float
    train_side: float
    pool_busy: dict[str, float] = field(hash=False)  # both sides, sync nodes left out
    sync: float
    synchronous: float  # the same plan's step at staleness 0 (no overlap), overheads included
    own_weights: dict[str, str] = field(default_factory=dict, hash=False)
    kind = "pipelined"  # in words (explain.py); streaming.StreamingStep's is "streaming"
    mode = AsyncMode.PIPELINE  # the type: `mode.streams` tells the two steps apart

    @property
    def busiest(self) -> tuple[str, float]:
        return max(self.pool_busy.items(), key=lambda item: item[1], default=("", 0.0))

    @property
    def overlapped(self) -> float:
        return max(self.rollout_side, self.train_side, self.busiest[1])

    @property
    def bound_by(self) -> str:
        """Which term sets the overlapped part, in words."""
        pool, busy = self.busiest
        if busy >= max(self.rollout_side, self.train_side):
            return f"pool {pool} busy {seconds_text(busy)} s on both sides"
        if self.rollout_side >= self.train_side:
            return f"the rollout side ({seconds_text(self.rollout_side)} s)"
        return f"the train side ({seconds_text(self.train_side)} s)"

    def describe(self) -> str:
        pools = ", ".join(f"{p} {seconds_text(s)}" for p, s in self.pool_busy.items())
        sync = f" + weight sync {seconds_text(self.sync)} s" if self.own_weights else ""
        return (f"max(rollout side {seconds_text(self.rollout_side)}, train side "
                f"{seconds_text(self.train_side)}, pool busy [{pools}]) s{sync}; "
                f"set by {self.bound_by}")

    def to_json(self) -> dict:
        return {"staleness": self.staleness, "rollout_side_s": round(self.rollout_side, 3),
                "train_side_s": round(self.train_side, 3),
                "pool_busy_s": {p: round(s, 3) for p, s in self.pool_busy.items()},
                "sync_s": round(self.sync, 3), "synchronous_step_s": round(self.synchronous, 3),
                "own_weights": dict(self.own_weights), "bound_by": self.bound_by}


def seconds_text(seconds: float) -> str:
    """One decimal for GPU-sized steps, three significant digits for a CPU's tiny ones."""
    return f"{seconds:.1f}" if seconds >= 1 else f"{seconds:.3g}"


class PipelinedSchedule:
    """`StepSchedule`'s interface (makespan, lower_bound) for the pipelined step."""

    def __init__(self, nodes: tuple[NodeInfo, ...], pool_of_role: dict[str, int], pools: int,
                 rollout_side: frozenset[str]):
        self.nodes, self.pools = nodes, pools
        ahead = [i for i, n in enumerate(nodes) if n.name in rollout_side]
        behind = [i for i, n in enumerate(nodes)
                  if n.name not in rollout_side and not n.kind.moves_weights]
        self.sync = [i for i, n in enumerate(nodes) if n.kind.moves_weights]
        train_nodes = tuple(replace(nodes[i], deps=tuple(d for d in nodes[i].deps
                                                         if d not in rollout_side))
                            for i in behind)
        self.sides = ((ahead, StepSchedule(tuple(nodes[i] for i in ahead), pool_of_role, pools)),
                      (behind, StepSchedule(train_nodes, pool_of_role, pools)))
        self.pool = [pool_of_role.get(n.role, -1) if n.role else -1 for n in nodes]

    def terms(self, seconds: list[float]) -> tuple[float, float, list[float], float]:
        """(rollout side, train side, busy time of each pool, weight sync)."""
        rollout, train = (schedule.makespan([seconds[i] for i in index])
                          for index, schedule in self.sides)
        busy = [0.0] * self.pools
        for i, pool in enumerate(self.pool):
            if pool >= 0 and not self.nodes[i].kind.moves_weights:
                busy[pool] += seconds[i]
        return rollout, train, busy, sum(seconds[i] for i in self.sync)

    def makespan(self, seconds: list[float]) -> float:
        rollout, train, busy, sync = self.terms(seconds)
        return max(rollout, train, *busy) + sync

    def lower_bound(self, seconds: list[float], busy: list[float]) -> float:
        """Each side's dependency chain, and each pool's least busy time (which may hold its
        share of the sync: still no more than the step)."""
        chains = [schedule.lower_bound([seconds[i] for i in index], [])
                  for index, schedule in self.sides]
        return max(*chains, *busy)

    def timings(self, seconds: list[float],
                pool_names: list[str]) -> tuple[dict[str, NodeTiming], list[str], tuple]:
        """Each side from 0 (they overlap), the sync after both; the critical path is the
        term that sets the step, then the sync nodes."""
        rollout, train, busy, sync = self.terms(seconds)
        out, paths = {}, []
        for index, schedule in self.sides:
            timings, path = schedule.timings([seconds[i] for i in index], pool_names)
            out.update(timings)
            paths.append(path)
        start = max(rollout, train, *busy)
        for i in self.sync:
            pool = self.pool[i]
            out[self.nodes[i].name] = NodeTiming(self.nodes[i].name, pool_names[pool], start,
                                                 start + seconds[i])
            start += seconds[i]
        if busy and max(busy) >= max(rollout, train):
            pool = busy.index(max(busy))
            path = [n.name for i, n in enumerate(self.nodes)
                    if self.pool[i] == pool and not n.kind.moves_weights]
        else:
            path = paths[0] if rollout >= train else paths[1]
        ordered = {n.name: out[n.name] for n in self.nodes}
        return ordered, path + [self.nodes[i].name for i in self.sync], (rollout, train, busy,
                                                                         sync)


def apart_problem(problem: Problem) -> Problem | None:
    """`problem` with each movable generate node run by its own role on weights of its own,
    and the weight sync (export on the host, load on the rollout) after the host's
    update; None when nothing may move."""
    pipeline = problem.pipeline
    if pipeline is None or not pipeline.movable:
        return None
    nodes, own, models = [], {}, dict(problem.models)
    for node in problem.nodes:
        role = pipeline.movable.get(node.name)
        if role is None:
            nodes.append(node)
            continue
        if node.role not in problem.models or not problem.trains(node.role):
            continue  # nothing to sync from: it stays where it is
        own[role], models[role] = node.role, problem.models[node.role]
        nodes.append(replace(node, role=role))
    if not own:
        return None
    for role, host in own.items():
        updates = tuple(n.name for n in nodes if n.role == host and n.kind.trains)
        export = NodeInfo(_unique(EXPORT_NODE, nodes), SYNC_KIND, host, updates)
        nodes.append(export)
        nodes.append(NodeInfo(_unique(SYNC_NODE, nodes), SYNC_KIND, role, (export.name,)))
    placed = problem.placed_roles + tuple(r for r in own if r not in problem.placed_roles)
    return replace(problem, nodes=tuple(nodes), models=models, placed_roles=placed,
                   own_weights=own)


def _unique(name: str, nodes: list[NodeInfo]) -> str:
    taken, out, i = {n.name for n in nodes}, name, 2
    while out in taken:
        out, i = f"{name}#{i}", i + 1
    return out


def apart_groupings(problem: Problem, partitions) -> list[tuple[tuple[str, ...], ...]]:
    """The partitions that keep every rollout apart from its host (colocated, it would
    share the host's module: that is the folded problem's plan)."""
    def apart(partition) -> bool:
        group_of = {role: i for i, group in enumerate(partition) for role in group}
        return all(group_of[r] != group_of[h] for r, h in problem.own_weights.items())
    return [p for p in partitions if apart(p)]
