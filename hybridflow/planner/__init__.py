"""Placement planner: which roles share devices, how many each pool gets, and each role's (dp, tp).

    result = plan_placement(plan, Cluster(2, 8, "h100-80g"),
                            {"actor": ModelSpec.from_name("7b"), ...},
                            Workload(prompts=1024, samples_per_prompt=1, prompt_len=1024,
                                     response_len=1024))
    print(result.explain())
    config["placement"] = result.best.to_placement_config()

Modules: devices (device table, Cluster), models (ModelSpec), problem (graph
view, Workload), cost (memory and time of one role), pool (colocated roles),
schedule (step simulation), pipeline (the overlapped step of an async run, the
rollout apart), streaming (the barrier-free step of a streaming run), search
(enumeration and pruning), ranking (the result as data), explain (table, paragraph,
JSON), render (graphviz) and result (PlannerResult: the ranking with its words and
drawing, on top of both).

May import `core/` only (its node kinds and async modes): the planner works on its
own problem types, and `program/` bridges a compiled plan to them.
"""
from .cost import Layout
from .devices import DEVICES, Cluster, Device, get_device
from .models import KNOWN_SIZES, ModelSpec
from .efficiency import Efficiency
from .pipeline import PipelineStep
from .problem import NodeInfo, Pipeline, PlanningError, TrainingBackend, Workload
from .ranking import Candidate, PoolPlan
from .result import PlannerResult
from .search import NoFeasiblePlacement, plan_placement
from .streaming import StreamingStep

__all__ = [
    "DEVICES",
    "KNOWN_SIZES",
    "Candidate",
    "Cluster",
    "Device",
    "Efficiency",
    "Layout",
    "ModelSpec",
    "NoFeasiblePlacement",
    "NodeInfo",
    "Pipeline",
    "PipelineStep",
    "PlannerResult",
    "PlanningError",
    "PoolPlan",
    "StreamingStep",
    "TrainingBackend",
    "Workload",
    "get_device",
    "plan_placement",
]
