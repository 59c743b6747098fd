"""Where a call's rows go and where a driver batch lives, worked out once per plan and
runtime (cached in the plan's `PlanAnalysis`). Stateless functions."""
from __future__ import annotations

from hybridflow.core.kinds import NodeKind, Op
from hybridflow.graph.dispatch import get_dispatch_mode
from hybridflow.plan.compiler import ExecutionPlan, PlanNode
from hybridflow.runtime.common import NodeFailure

__all__ = ["slot_layout", "home_slots"]


def slot_layout(ex, plan: ExecutionPlan, analysis, node: PlanNode):
    """(dispatch mode, group layout, slot layout or None) of a call."""
    cached = analysis.layouts.get(node.name)
    if cached is None:
        mode = get_dispatch_mode(node.dispatch)
        try:
            layout = plan.placement.layout(  # a generate call never splits rows (sp)
                node.role, world=ex.pool_size(node.pool),
                generating=node.kind is NodeKind.GENERATE)
        except ValueError as err:
            raise NodeFailure(node, None, str(err)) from None
        cached = analysis.layouts[node.name] = (mode, layout, mode.slot_layout(layout))
    return cached


def home_slots(ex, plan: ExecutionPlan, analysis, name: str) -> list:
    """Where a batch put by the driver goes: one slot per chunk its first consumer
    call receives, each on the first rank that receives it."""
    homes = analysis.homes.get(name)
    if homes is None:
        homes = analysis.homes[name] = _home_slots(ex, plan, analysis, name)
    return homes


def _home_slots(ex, plan: ExecutionPlan, analysis, name: str) -> list:
    for node in plan.nodes:
        if name in node.deps and node.op is Op.CALL:
            _, _, slots = slot_layout(ex, plan, analysis, node)
            return [(node.pool, slots.receiver(s)) for s in range(slots.slots)]
    pool = next((n.pool for n in plan.nodes if n.pool), None)
    return [(pool, r) for r in range(ex.pool_size(pool))] if pool else []
