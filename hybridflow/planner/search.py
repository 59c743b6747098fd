"""Search placements: groupings x device allocations x per-role (dp, tp, sp).

State of one search: a CostModel (memoised role costs), a cache of each
pool's Pareto layouts keyed by (roles, devices), and for every grouping the
best plan found so far. It enumerates
1. set partitions of the placed roles into colocated groups,
2. allocations of whole devices to the groups: pools inside one node take a
   divisor of the node's devices, larger pools take whole nodes (in at most
   MAX_ALLOCATION_STEPS steps of the cluster), and together they use the
   whole cluster,
3. for each pool, its Pareto-optimal layouts (see pool.py),
and simulates the step for each combination (schedule.py), keeping the
fastest plan per grouping. Branch and bound: sizes are chosen group by group,
and a partial allocation whose lower bound (bounds.py: the dependency chain of
the fastest node times, or a pool's earliest start plus its least busy time,
over every completion) cannot beat the grouping's best, or the k-th best
grouping, is not extended.
Pruning drops only what cannot be among the top k, so results are exact for
the enumerated space (tests compare against brute force).
"""
from __future__ import annotations

import itertools
import time
from collections.abc import Iterator

from hybridflow.core.kinds import NodeKind

from .bounds import GroupBounds, partial_bound
from .cost import CostModel
from .devices import Cluster
from .models import ModelSpec
from .pipeline import PipelinedSchedule, PipelineStep, apart_groupings, apart_problem
from .pool import PoolEval, Shortfall, pool_options
from .problem import (Pipeline, PlanningError, Problem, TrainingBackend, Workload,
                      build_problem)
from .ranking import Candidate, PoolPlan
from .result import PlannerResult
from .schedule import StepSchedule
from .streaming import StreamingSchedule, streaming_step


class NoFeasiblePlacement(PlanningError):
    """No grouping and allocation fits in device memory."""

    def __init__(self, message: str, rejected: list[Shortfall]):
        super().__init__(message)
        self.rejected = rejected


def set_partitions(items: tuple[str, ...]) -> Iterator[tuple[tuple[str, ...], ...]]:
    """Every way to split `items` into non-empty groups; the one-group split comes first."""
    if not items:
        yield ()
        return
    first, rest = items[0], items[1:]
    for partition in set_partitions(rest):
        for i in range(len(partition)):  # join first into an existing group
            yield tuple(((first,) + g) if j == i else g for j, g in enumerate(partition))
        yield ((first,),) + partition  # or give it its own group


# Whole-node pools come in at most this many steps of the cluster: finer
# splits of a large cluster change the step time little and multiply the
# allocations to search (5 groups over 128 single-device nodes: 10^7).
MAX_ALLOCATION_STEPS = 16


def allowed_pool_sizes(cluster: Cluster) -> list[int]:
    """Device counts a pool may take, ascending.

    Divisors of a node's devices (pools inside one node), then whole nodes: on
    clusters of more than MAX_ALLOCATION_STEPS nodes, multiples of
    ceil(nodes / MAX_ALLOCATION_STEPS) nodes, and what such pools leave over.
    """
    gpn, nodes = cluster.gpus_per_node, cluster.nodes
    inside = [d for d in range(1, gpn) if gpn % d == 0]
    step = -(-nodes // MAX_ALLOCATION_STEPS)
    whole = ({k for k in range(step, nodes + 1, step)}
             | {nodes - k for k in range(step, nodes, step)})
    return inside + [gpn * k for k in sorted(whole)]


def fits_on_nodes(sizes: tuple[int, ...], cluster: Cluster) -> bool:
    """Whether pools of these sizes pack onto the cluster's nodes (first-fit decreasing)."""
    gpn = cluster.gpus_per_node
    whole = sum(s // gpn for s in sizes if s >= gpn)
    bins = [gpn] * (cluster.nodes - whole)
    for size in sorted((s for s in sizes if s < gpn), reverse=True):
        slot = next((i for i, free in enumerate(bins) if free >= size), None)
        if slot is None:
            return False
        bins[slot] -= size
    return True


class Search:
    def __init__(self, problem: Problem, top_k: int, groupings=None):
        self.problem = problem
        self.groupings = groupings  # None: every set partition of the placed roles
        self.cost = CostModel(problem)
        self.top_k = max(1, top_k)
        self.pools: dict[tuple, list[PoolEval] | Shortfall] = {}
        self.best: dict[tuple, tuple[float, tuple[PoolEval, ...]]] = {}
        self.bounds: dict[tuple, GroupBounds] = {}
        self.simulated = 0

    def options(self, roles: tuple[str, ...], devices: int) -> list[PoolEval] | Shortfall:
        key = (roles, devices)
        if key not in self.pools:
            self.pools[key] = pool_options(self.cost, roles, devices)
        return self.pools[key]

    def kth_best(self) -> float:
        times = sorted(t for t, _ in self.best.values())
        return times[self.top_k - 1] if len(times) >= self.top_k else float("inf")

    def bound(self, partition) -> float:
        """Plans at or above this cannot improve the grouping's best nor enter the top k."""
        return min(self.best.get(partition, (float("inf"),))[0], self.kth_best())

    def run(self) -> None:
        sizes = allowed_pool_sizes(self.problem.cluster)
        base = [driver_seconds(self.problem, n) for n in self.problem.nodes]
        partitions = (set_partitions(self.problem.placed_roles) if self.groupings is None
                      else self.groupings)
        for partition in partitions:
            schedule = self.schedule_for(partition)
            tables = [self.group_bounds(group, sizes) for group in partition]
            self.extend(partition, schedule, tables, base, (), self.problem.cluster.devices)

    def schedule_for(self, partition) -> StepSchedule | PipelinedSchedule:
        pool_of_role = {role: i for i, group in enumerate(partition) for role in group}
        return step_schedule(self.problem, pool_of_role, len(partition))

    def group_bounds(self, group: tuple[str, ...], sizes: list[int]) -> GroupBounds:
        if group not in self.bounds:
            names = [n.name for n in self.problem.nodes if n.role in group]
            index = {n.name: i for i, n in enumerate(self.problem.nodes)}
            self.bounds[group] = GroupBounds([index[n] for n in names], names, sizes,
                                             [self.options(group, size) for size in sizes])
        return self.bounds[group]

    def extend(self, partition, schedule, tables, base, chosen: tuple[int, ...], left: int) -> None:
        """Choose the next group's size, skipping sizes whose subtree cannot win."""
        groups, sizes = len(partition), tables[0].sizes
        if len(chosen) == groups - 1:
            allocation = chosen + (left,)
            if left in sizes and fits_on_nodes(allocation, self.problem.cluster):
                self.try_allocation(partition, allocation, schedule, tables, base)
            return
        later = groups - len(chosen) - 1  # groups after the one being sized
        room = left - sizes[0] * later
        share = left / (groups - len(chosen))
        for size in sorted((s for s in sizes if s <= room), key=lambda s: abs(s - share)):
            cap = left - size - sizes[0] * (later - 1)
            if partial_bound(schedule, base, tables, chosen + (size,), cap) < self.bound(partition):
                self.extend(partition, schedule, tables, base, chosen + (size,), left - size)

    def try_allocation(self, partition, sizes, schedule: StepSchedule, tables, base) -> None:
        options = [self.options(group, n) for group, n in zip(partition, sizes)]
        if any(isinstance(o, Shortfall) for o in options):
            return
        if partial_bound(schedule, base, tables, sizes, 0) >= self.bound(partition):
            return
        for combo in itertools.product(*options):
            step = schedule.makespan(node_seconds(self.problem, combo))
            self.simulated += 1
            if step < self.best.get(partition, (float("inf"),))[0]:
                self.best[partition] = (step, combo)


def driver_seconds(problem: Problem, node) -> float:
    """Sources are free; functions cost one driver round trip; rule roles also their own work
    per sequence."""
    if node.kind == NodeKind.SOURCE:
        return 0.0
    eff = problem.cluster.spec.efficiency
    rule = eff.rule_seconds_per_sequence * problem.workload.sequences if node.role else 0.0
    return eff.node_call_overhead_s + rule


def node_seconds(problem: Problem, pools: tuple[PoolEval, ...]) -> list[float]:
    merged: dict[str, float] = {}
    for ev in pools:
        merged.update(ev.node_seconds)
    return [merged.get(n.name, driver_seconds(problem, n)) for n in problem.nodes]


def step_schedule(problem: Problem, pool_of_role: dict[str, int],
                  pools: int) -> StepSchedule | PipelinedSchedule:
    """The synchronous step, or with `problem.pipeline` the pipelined one (pipeline.py)."""
    if problem.pipeline is None:
        return StepSchedule(problem.nodes, pool_of_role, pools)
    if problem.pipeline.streaming:  # no barrier: producer against consumer (streaming.py)
        return StreamingSchedule(problem.nodes, pool_of_role, pools,
                                 problem.pipeline.rollout_side,
                                 problem.cluster.spec.efficiency.step_overhead_s)
    return PipelinedSchedule(problem.nodes, pool_of_role, pools, problem.pipeline.rollout_side)


def make_candidate(problem: Problem, pools: tuple[PoolEval, ...]) -> Candidate:
    """Full timings, critical path and pool descriptions for one plan."""
    gpn = problem.cluster.gpus_per_node
    plans = []
    for ev in pools:
        nodes, per_node = (ev.devices // gpn, gpn) if ev.devices >= gpn else (1, ev.devices)
        plans.append(PoolPlan("_".join(ev.roles), ev.roles, ev.devices, nodes, per_node,
                              dict(ev.layouts), ev.memory, ev.busy_seconds, dict(ev.decode_batch)))
    pool_of_role = {r: i for i, ev in enumerate(pools) for r in ev.roles}
    schedule = StepSchedule(problem.nodes, pool_of_role, len(pools))
    seconds = node_seconds(problem, pools)
    overhead = problem.cluster.spec.efficiency.step_overhead_s
    if problem.pipeline is not None and problem.pipeline.streaming:
        return streaming_candidate(problem, tuple(plans), pool_of_role, seconds,
                                   schedule.makespan(seconds) + overhead)
    if problem.pipeline is not None:
        return pipelined_candidate(problem, tuple(plans), pool_of_role, seconds,
                                   schedule.makespan(seconds) + overhead)
    timings, path = schedule.timings(seconds, [p.name for p in plans])
    # fixed per-step costs (data, metrics, bookkeeping) come after the last node
    step = max((t.end for t in timings.values()), default=0.0) + overhead
    return Candidate(tuple(plans), step, timings, path, problem.driver_roles,
                     graph_nodes=problem.nodes)


def pipelined_candidate(problem: Problem, plans: tuple[PoolPlan, ...], pool_of_role,
                        seconds: list[float], synchronous: float) -> Candidate:
    schedule = PipelinedSchedule(problem.nodes, pool_of_role, len(plans),
                                 problem.pipeline.rollout_side)
    names = [p.name for p in plans]
    timings, path, (rollout, train, busy, sync) = schedule.timings(seconds, names)
    terms = PipelineStep(problem.pipeline.staleness, rollout, train, dict(zip(names, busy)),
                         sync, synchronous, dict(problem.own_weights))
    step = terms.overlapped + sync + problem.cluster.spec.efficiency.step_overhead_s
    return Candidate(plans, step, timings, path, problem.driver_roles, pipeline=terms,
                     graph_nodes=problem.nodes)


def streaming_candidate(problem: Problem, plans: tuple[PoolPlan, ...], pool_of_role,
                        seconds: list[float], synchronous: float) -> Candidate:
    schedule = step_schedule(problem, pool_of_role, len(plans))
    timings, path, terms = streaming_step(schedule, seconds, [p.name for p in plans],
                                          problem.pipeline.staleness, synchronous,
                                          problem.own_weights, problem.workload.sequences)
    return Candidate(plans, terms.step, timings, path, problem.driver_roles, pipeline=terms,
                     graph_nodes=problem.nodes)


def plan_placement(graph, cluster: Cluster, models: dict[str, ModelSpec], workload: Workload,
                   top_k: int = 5, backend: TrainingBackend | None = None,
                   groupings=None, rollout_tp: int = 0,
                   pipeline: Pipeline | None = None,
                   sequence_parallel: bool = True) -> PlannerResult:
    """Choose colocation, pool sizes and per-role (dp, tp, sp) for `graph` on `cluster`.

    `groupings` (tuples of role tuples) restricts the search to those
    colocations, e.g. a published system's own; `rollout_tp` fixes the rollout's
    tensor-parallel size where a pool allows it. With a `pipeline` (staleness >= 1)
    every plan is timed as a pipelined step (or, with `pipeline.streaming`, as a
    streaming one: streaming.py), and the plans with each movable
    generate node on a pool of its own, weights synced, compete too (pipeline.py);
    `groupings` then place it apart where they name its role (e.g. "rollout").
    `sequence_parallel=False` keeps every role at sp=1 (a run that cannot split rows);
    else a role whose row does not fit at sp=1 may be planned at the sp it needs.
    Raises PlanningError for bad inputs and NoFeasiblePlacement when nothing fits.
    """
    from .explain import reason_lost  # explain imports result, which this module feeds

    began = time.perf_counter()
    problem = build_problem(graph, cluster, models, workload, backend, rollout_tp, pipeline,
                            sequence_parallel)
    searches = searches_for(problem, apart_problem(problem), top_k, groupings)
    for search in searches:
        search.run()
    rejected = collect_rejections(searches)
    found = [(step, combo, s.problem) for s in searches for step, combo in s.best.values()]
    if not found:
        raise NoFeasiblePlacement(no_fit_message(problem, rejected), rejected)
    ranked = sorted(found, key=lambda item: item[0])[: max(1, top_k)]
    candidates = [make_candidate(p, combo) for _, combo, p in ranked]
    for runner_up in candidates[1:]:
        runner_up.reason = reason_lost(runner_up, candidates[0])
    everything = (problem.placed_roles,)
    colocated = None
    if everything in searches[0].best:
        colocated = make_candidate(problem, searches[0].best[everything][1])
        if colocated.grouping != candidates[0].grouping:
            colocated.reason = reason_lost(colocated, candidates[0])
    shared = best_of(searches[0]) if pipeline is not None else None
    apart_best = best_of(searches[1]) if len(searches) > 1 else None
    return PlannerResult(candidates[0], candidates[1:], colocated, rejected,
                         time.perf_counter() - began,
                         sum(s.simulated for s in searches), problem.nodes, cluster, workload,
                         dict(models), problem.backend, pipeline, shared, apart_best)


def searches_for(problem: Problem, apart: Problem | None, top_k: int,
                 groupings) -> list[Search]:
    """The rollout shared with its host (folded), and when it may move, apart; given
    groupings go to the apart search where they name a rollout role."""
    if apart is None:
        return [Search(problem, top_k, groupings)]
    if groupings is None:
        mine = apart_groupings(apart, set_partitions(apart.placed_roles))
        return [Search(problem, top_k), Search(apart, top_k, mine)]

    def names_rollout(grouping) -> bool:
        return any(role in apart.own_weights for group in grouping for role in group)

    shared = [g for g in groupings if not names_rollout(g)]
    mine = apart_groupings(apart, [g for g in groupings if names_rollout(g)])
    return [Search(problem, top_k, shared), Search(apart, top_k, mine)]


def best_of(search: Search) -> Candidate | None:
    if not search.best:
        return None
    return make_candidate(search.problem, min(search.best.values(), key=lambda b: b[0])[1])


def collect_rejections(searches: list[Search]) -> list[Shortfall]:
    """For each group of roles, the largest pool that still does not fit."""
    worst: dict[tuple, Shortfall] = {}
    for search in searches:
        for (roles, devices), options in search.pools.items():
            if isinstance(options, Shortfall) and devices > getattr(worst.get(roles), "devices",
                                                                    0):
                worst[roles] = options
    return sorted(worst.values(), key=lambda s: (-len(s.roles), s.roles))


def no_fit_message(problem: Problem, rejected: list[Shortfall]) -> str:
    label = problem.cluster.spec.label
    lines = [f"no placement fits on {problem.cluster.describe()}:"]
    lines += [f"  - {s.reason(label)}" for s in rejected[:6]]
    if problem.sequence_parallel:
        lines.append("use more or larger devices, smaller models, or a shorter "
                     "sequence/micro-batch")
    else:  # the run could not split rows: say that it might where it can
        lines.append("use more or larger devices, smaller models, a shorter sequence/micro-batch, "
                     "or a run that can split rows over sp ranks (sequence parallelism: "
                     "--runtime ray, no LoRA, an sdpa/eager attention)")
    return "\n".join(lines)
