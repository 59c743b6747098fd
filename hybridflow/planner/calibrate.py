"""Fit a device's efficiency constants to one measured run, and predict a run's node times.

`predict_run(run, device)` plans the run's own graph, models, workload and
colocation on `device` and returns the predicted seconds per node and per step.
`calibrate(run, device)` returns `device` with its constants fitted so the
prediction meets the measurement, each from the nodes it governs, in an order
where each fit only depends on the ones before:
1. `node_call_overhead_s`: function nodes cost exactly that (the cheapest is
   taken: a one-off stall only adds to it); `rule_seconds_per_sequence`: what a
   rule role's node (a reward function on the driver) takes beyond it, per sequence;
2. `mfu_forward`: inference nodes (forward passes), whose time falls as it grows;
   on a tiny model it is the whole pass's effective rate, overheads included;
3. `decode_step_overhead_s`: generate nodes, given the prefill rate of step 2;
4. `mfu_train`: train nodes;
5. `step_overhead_s`: the measured step minus the simulated makespan.
The device's peaks and measured launch latency stay as they are.
Each is a one-dimensional monotone solve (bisection in log space), so a
synthetic timeline made with known constants gives them back. Stateless.
"""
from __future__ import annotations

import dataclasses
import math

from hybridflow.core.kinds import NodeKind

from .devices import Device
from .efficiency import Efficiency
from .measured import MeasuredRun
from .search import plan_placement

KIND_CONSTANT = (  # node kind -> the constant it calibrates, and the range searched
    (NodeKind.INFERENCE, "mfu_forward", 1e-6, 10.0),
    (NodeKind.GENERATE, "decode_step_overhead_s", 1e-8, 10.0),
    (NodeKind.TRAIN, "mfu_train", 1e-6, 10.0),
)
BISECTIONS = 60


@dataclasses.dataclass(frozen=True)
class Prediction:
    node_seconds: dict[str, float]
    step_seconds: float
    pipeline: object = None  # an async run's step terms (planner.PipelineStep)


def predict_run(run: MeasuredRun, device: Device) -> Prediction:
    result = plan_placement(run.plan, run.cluster(device), run.models, run.workload,
                            top_k=1, groupings=[run.groupings], pipeline=run.pipeline)
    return Prediction(result.best.node_seconds, result.best.step_seconds, result.best.pipeline)


def calibrate(run: MeasuredRun, device: Device) -> Device:
    """`device` with the constants of KIND_CONSTANT, node_call_overhead_s and step_overhead_s
    fitted to `run`."""
    kinds = {n.name: n.kind for n in run.plan.nodes}
    eff = device.efficiency
    functions = [s for n, s in run.node_seconds.items() if kinds.get(n) == NodeKind.FUNCTION]
    if functions:
        eff = dataclasses.replace(eff, node_call_overhead_s=min(functions))
    rules = [s for n, s in run.node_seconds.items()
             if _on_driver(run, n, kinds) and kinds.get(n) != NodeKind.FUNCTION]
    if rules:
        extra = max(0.0, sum(rules) / len(rules) - eff.node_call_overhead_s)
        eff = dataclasses.replace(eff, rule_seconds_per_sequence=extra / run.workload.sequences)
    eff = dataclasses.replace(eff, step_overhead_s=0.0)
    for kind, name, low, high in KIND_CONSTANT:
        nodes = [n for n, k in kinds.items() if k == kind and n in run.node_seconds
                 and not _on_driver(run, n, kinds)]  # a rule role's score is a driver call
        if nodes:
            eff = _solve(run, device, eff, name, nodes, low, high)
    makespan = predict_run(run, dataclasses.replace(device, efficiency=eff)).step_seconds
    eff = dataclasses.replace(eff, step_overhead_s=max(0.0, run.step_seconds - makespan))
    return dataclasses.replace(device, efficiency=eff)


def _on_driver(run: MeasuredRun, node: str, kinds: dict[str, str]) -> bool:
    role = next((n.role for n in run.plan.nodes if n.name == node), None)
    return kinds.get(node) == NodeKind.FUNCTION or (role is not None and role not in run.models)


def _solve(run: MeasuredRun, device: Device, eff: Efficiency, name: str, nodes: list[str],
           low: float, high: float) -> Efficiency:
    """The value of constant `name` in [low, high] at which the nodes' predicted total meets
    the measured total (the bound nearest it when none does)."""
    target = sum(run.node_seconds[n] for n in nodes)

    def total(value: float) -> float:
        trial = dataclasses.replace(device, efficiency=dataclasses.replace(eff, **{name: value}))
        predicted = predict_run(run, trial).node_seconds
        return sum(predicted[n] for n in nodes)

    rising = total(high) > total(low)
    lo, hi = math.log(low), math.log(high)
    for _ in range(BISECTIONS):
        mid = (lo + hi) / 2
        if (total(math.exp(mid)) < target) == rising:
            lo = mid
        else:
            hi = mid
    return dataclasses.replace(eff, **{name: math.exp((lo + hi) / 2)})
