"""Where each function node of a compiled plan runs, as the step scheduler decides it
(runtime/scheduler.py: `StepScheduler._try_submit` picks `_submit_sharded_fn`,
`_submit_whole_fn` or `_submit_driver_fn`), for the labels of `check`, `render --plan`
and the docs. Stateless.

The scheduler runs a function node next to its first input's output:

- `driver`: it keeps state across steps (`state_dict()`; the loop checkpoints it
  there), or no pool exists;
- `sharded`: it declares how it may be split (`group_by` or `rows=True`): each rank
  holding a shard of its first input runs it on that shard;
- `whole`: otherwise, on one worker (the first shard's) over the whole batch.

Its first input's output lives on a pool: a call's on the call's pool, a function's
where that function ran, a source's (and a driver function's) on the pool of the
first call that reads it (else the plan's first pool).
"""
from __future__ import annotations

from typing import NamedTuple

from hybridflow.core.kinds import Op

__all__ = ["Site", "fn_site", "site_label"]


class Site(NamedTuple):
    how: str            # "driver" | "sharded" | "whole"
    pool: str | None    # the pool whose workers run it (None: the driver)


def fn_site(plan, node) -> Site:
    """Where function node `node` of `plan` runs."""
    if callable(getattr(node.fn, "state_dict", None)):
        return Site("driver", None)
    pool = _home_pool(plan, node.deps[0]) if node.deps else None
    if pool is None:
        return Site("driver", None)
    return Site("sharded" if node.group_by or node.rows else "whole", pool)


def _home_pool(plan, name: str, seen: frozenset = frozenset()) -> str | None:
    nodes = {n.name: n for n in plan.nodes}
    node = nodes.get(name)
    if node is None or name in seen:
        return None
    if node.op is Op.CALL:
        return node.pool
    if node.op is Op.FN:
        site = fn_site(plan, node)
        if site.how != "driver":
            return site.pool
    if node.op is Op.GATHER and node.deps:  # rounds of its input, kept where they ran
        return _home_pool(plan, node.deps[0], seen | {name})
    # put by the driver: to the first call that reads it, else the first pool
    reader = next((n for n in plan.nodes if name in n.deps and n.op is Op.CALL), None)
    if reader is not None:
        return reader.pool
    return next((n.pool for n in plan.nodes if n.pool), None)


def site_label(plan, node) -> str:
    """'driver', 'workers of pool main (sharded)' or 'a worker of pool main (whole batch)'."""
    site = fn_site(plan, node)
    if site.how == "driver":
        return "driver"
    if site.how == "sharded":
        return f"workers@{site.pool} (sharded)"
    return f"worker@{site.pool} (whole batch)"
