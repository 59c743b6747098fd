"""The planner's ranking as data: candidate plans, best first, and the rejected pools.

This module holds data only; words (explain.py), drawings (render.py) and the
public `PlannerResult` that offers them as methods (result.py) sit above it, so
the planner's modules import in one direction.

A Candidate is one grouping of roles into pools with device counts and
per-role (dp, tp); `to_placement_config()` writes it as the placement section
of a run's config:

    {"pools": {"<pool>": {"nodes": int, "devices_per_node": int}},
     "roles": {"<role>": "<pool>"},
     "parallel": {"<role>": {"dp": int, "tp": int, "sp": int (only above 1)}}}

Roles that need no device (rule functions) are absent from "roles": they run
on the driver.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .cost import Layout
from .devices import Cluster
from .models import ModelSpec
from .pipeline import PipelineStep
from .pool import MemoryUse, Shortfall
from .problem import NodeInfo, Pipeline, TrainingBackend, Workload
from .schedule import NodeTiming
from .streaming import StreamingStep


@dataclass(frozen=True)
class PoolPlan:
    name: str
    roles: tuple[str, ...]
    devices: int
    nodes: int
    devices_per_node: int
    layouts: dict[str, Layout]
    memory: MemoryUse
    busy_seconds: float
    decode_batch: dict[str, int]

    def describe(self) -> str:
        layouts = " ".join(f"{r} {self.layouts[r].dp}x{self.layouts[r].tp}"
                           + (f" sp{self.layouts[r].sp}" if self.layouts[r].sp > 1 else "")
                           for r in self.roles)
        return f"{'+'.join(self.roles)}[{self.devices}: {layouts}]"

    def to_json(self) -> dict:
        return {
            "name": self.name, "roles": list(self.roles), "devices": self.devices,
            "nodes": self.nodes, "devices_per_node": self.devices_per_node,
            "parallel": {r: lay.parallel_config() for r, lay in self.layouts.items()},
            "memory": self.memory.to_json(), "busy_seconds": round(self.busy_seconds, 3),
            "decode_batch": dict(self.decode_batch),
        }


@dataclass
class Candidate:
    pools: tuple[PoolPlan, ...]
    step_seconds: float
    timings: dict[str, NodeTiming]
    critical_path: list[str]
    driver_roles: tuple[str, ...] = ()
    reason: str = ""  # why it lost to the best; empty for the best
    # the step's terms when rollout and training overlap (streaming: no barrier)
    pipeline: PipelineStep | StreamingStep | None = None
    # the graph as this plan runs it (a rollout apart adds its role and the weight sync)
    graph_nodes: tuple[NodeInfo, ...] = ()

    @property
    def node_seconds(self) -> dict[str, float]:
        return {name: t.seconds for name, t in self.timings.items()}

    @property
    def grouping(self) -> tuple[tuple[str, ...], ...]:
        return tuple(p.roles for p in self.pools)

    @property
    def colocated(self) -> bool:
        return len(self.pools) == 1

    def pool_of(self, role: str) -> PoolPlan:
        return next(p for p in self.pools if role in p.roles)

    def pool_of_name(self, name: str) -> PoolPlan:
        return next(p for p in self.pools if p.name == name)

    def label(self) -> str:
        return " | ".join(p.describe() for p in self.pools)

    def to_placement_config(self) -> dict:
        return {
            "pools": {p.name: {"nodes": p.nodes, "devices_per_node": p.devices_per_node}
                      for p in self.pools},
            "roles": {r: p.name for p in self.pools for r in p.roles},
            "parallel": {r: lay.parallel_config()
                         for p in self.pools for r, lay in p.layouts.items()},
        }

    def to_json(self) -> dict:
        return {
            "label": self.label(),
            "step_seconds": round(self.step_seconds, 3),
            "pools": [p.to_json() for p in self.pools],
            "nodes": {n: {"pool": t.pool, "start": round(t.start, 3), "end": round(t.end, 3),
                          "seconds": round(t.seconds, 3)} for n, t in self.timings.items()},
            "critical_path": list(self.critical_path),
            "driver_roles": list(self.driver_roles),
            "reason": self.reason,
            "placement": self.to_placement_config(),
            **({"pipeline": self.pipeline.to_json()} if self.pipeline else {}),
        }


@dataclass
class Ranking:
    """The search's outcome; `PlannerResult` (result.py) adds words and drawings."""

    best: Candidate
    candidates: list[Candidate]  # runners-up, best first, each with `reason`
    colocated: Candidate | None  # the fixed "everything in one pool on all devices" plan
    rejected: list[Shortfall]  # pools that do not fit, with the numbers
    search_seconds: float
    plans_simulated: int
    nodes: tuple[NodeInfo, ...]
    cluster: Cluster
    workload: Workload
    models: dict[str, ModelSpec] = field(default_factory=dict)
    backend: TrainingBackend = field(default_factory=TrainingBackend)
    pipeline: Pipeline | None = None  # staleness >= 1: steps are pipelined (pipeline.py)
    # with a pipeline: the best plan with the rollout sharing its host's module, and the
    # best with it on a pool of its own (None: none fits, or nothing may move)
    rollout_shared: Candidate | None = None
    rollout_apart: Candidate | None = None

    def driver_roles_text(self) -> str:
        roles = self.best.driver_roles
        return f"Role(s) {', '.join(roles)} need no device and run on the driver." if roles else ""

    @property
    def ranked(self) -> list[Candidate]:
        return [self.best, *self.candidates]
