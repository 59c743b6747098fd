"""A measured run as the planner sees it: the frozen record `program/run_dir.py` reads out of
a run directory and `calibrate.py` fits devices to. Holds no state."""
from __future__ import annotations

from dataclasses import dataclass

from .devices import Cluster
from .models import ModelSpec
from .problem import Workload


@dataclass(frozen=True)
class MeasuredRun:
    run_dir: str
    plan: object  # the compiled graph (ExecutionPlan): .nodes
    models: dict[str, ModelSpec]
    workload: Workload
    devices: int
    groupings: tuple[tuple[str, ...], ...]
    node_seconds: dict[str, float]  # median over the steps kept
    step_seconds: float  # median wall time of the steps kept (the loop's perf/time_per_step)
    steps: tuple[int, ...]
    pipeline: object = None  # planner.Pipeline of an async run (trainer.staleness >= 1)

    def cluster(self, device) -> Cluster:
        """One node of the run's devices; `device` is a name or a Device."""
        return Cluster(1, self.devices, device)
