"""The compiler removes a pass the algorithm provably does not need.

A training method may declare keys its loss reads that it can take from its own
forward (`takes_loss(current={"old_log_probs": "log_probs"})`, graph/loss.py): before
the method's first optimizer step its weights are still those another node computed
the keys with, so the values are equal. A plan node P that writes such keys for a
training node T is removed when all of these hold (else P stays, and why is said):

- P is a `call` of T's role, of kind inference, called without arguments, on inputs
  T reads too (the same rows), and every key it writes is one T may take from its
  forward;
- T is the only node that reads P (no metric, no KL in a reward, nothing passed on)
  and the role's only training node (nothing else changes the weights between them);
- T passes no argument that P's method also takes (a `temperature` of its own would
  make the two forwards differ);
- T makes one optimizer step per batch: `steps(T)` (the program asks the worker's
  `optimizer_steps` hook, core/worker_hooks.py, for the most rows T can receive,
  `rows_bound`) is 1.

T then gets the argument that names those keys (`from_current=(...)`); the worker
fills them from its forward, detached (workers/loss_inputs.py `with_current`), and
refuses a batch that would make more than one step. `plan.unneeded` keeps one
`Unneeded` record per such P, removed or kept, with the reason: `check` prints them
(the plan's summary) and the drawing shows a removed node dashed and grey.
Where the worker's `input_sources` hook says T takes the keys from another column of
its input (`actor.old_log_probs=rollout`: the engine's `rollout_log_probs`), P goes
whatever the optimizer steps (those values do not move with the weights), and T reads
that column instead; a plan where no input provides it is refused (GraphError).
`trainer.keep_unneeded_passes=true` keeps every node (the program does not call
`drop_unneeded`). Stateless.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

from hybridflow.core.kinds import NodeKind, Op, RowEffect
from hybridflow.graph.dispatch import worker_methods
from hybridflow.graph.loss import loss_slot
from hybridflow.plan.compiler import (SUMMARY_SECTIONS, ExecutionPlan, GraphError, PlanNode,
                                      plan_stages)

__all__ = ["Unneeded", "drop_unneeded", "rows_bound", "unneeded_summary", "KEEP_OPTION"]

KEEP_OPTION = "trainer.keep_unneeded_passes=true"
# steps(T) -> (optimizer steps per batch or None: unknown, the most rows or None)
StepsOf = Callable[[PlanNode], "tuple[int | None, int | None]"]


@dataclass(frozen=True)
class Unneeded:
    """A node the compiler found it may not need: removed or kept, and why."""
    node: PlanNode            # as compiled
    consumer: str             # the training node that reads its keys
    keys: tuple[str, ...]
    removed: bool
    reason: str

    def line(self) -> str:
        what = "removed" if self.removed else "kept"
        target = f"{self.node.role}.{self.node.method}"
        return f"{what}: '{self.node.name}' ({target}, {self.node.location}): {self.reason}"


def rows_bound(plan: ExecutionPlan, name: str, source_rows: int,
               repeats: Callable[[PlanNode], int | None]) -> int | None:
    """The most rows node `name` can receive in a step: a source gives `source_rows`,
    a node that repeats rows multiplies by `repeats(node)`, a gather gives its `until`,
    a node that keeps rows the most of its inputs; None when unknown."""
    memo: dict[str, int | None] = {}

    def rows(n: str) -> int | None:
        if n not in memo:
            node = plan.node(n)
            ins = [rows(d) for d in node.deps]
            top = None if not ins or None in ins else max(ins)
            if node.op is Op.SOURCE:
                memo[n] = source_rows
            elif node.op is Op.GATHER:
                memo[n] = int(node.kwargs["until"])
            elif top is None or node.row_effect not in (RowEffect.KEEPS, RowEffect.REPEATS):
                memo[n] = None
            elif node.row_effect is RowEffect.REPEATS:
                k = repeats(node)
                memo[n] = None if k is None else top * k
            else:
                memo[n] = top
        return memo[n]
    ins = [rows(d) for d in plan.node(name).deps]
    return None if not ins or None in ins else max(ins)


def _own_keys(plan: ExecutionPlan, train: PlanNode) -> tuple[dict, str] | None:
    """(key -> output, the argument naming them) of a training node's method."""
    slot = loss_slot(getattr(plan.bindings[train.role], train.method, None))
    return (dict(slot.current), slot.current_param) if slot and slot.current else None


def _why_kept(plan: ExecutionPlan, node: PlanNode, train: PlanNode, keys) -> str | None:
    """Why `node` must stay whoever computes its keys instead, or None."""
    readers = [n for n in plan.consumers(node.name) if n != train.name]
    if readers:
        return (f"its {', '.join(keys)} also feed {', '.join(repr(r) for r in readers)}, "
                f"which read the weights from before '{train.name}'")
    other = [d for d in node.deps if d not in train.deps]
    if other:
        return (f"it reads other rows ({', '.join(repr(d) for d in other)}) than "
                f"'{train.name}' trains on")
    if node.kwargs:
        return (f"it is called with arguments ({', '.join(node.kwargs)}), which may make it "
                f"compute other values than '{train.name}''s forward")
    return None


def _why_not_current(plan: ExecutionPlan, node: PlanNode, train: PlanNode, keys,
                     steps: StepsOf) -> tuple[str | None, int | None, int | None]:
    """Why `train`'s own forward cannot stand in for `node`'s keys, or None."""
    trains = [n.name for n in plan.nodes if n.role == train.role and n.kind is NodeKind.TRAIN]
    if trains != [train.name]:
        return (f"role '{train.role}' trains in {trains}: its weights may change between "
                f"them", None, None)
    params = worker_methods(plan.bindings[node.role])[node.method].params
    shared = [k for k in train.kwargs if k in params]
    if shared:
        return (f"'{train.name}' passes {', '.join(shared)}, which '{node.name}' computes "
                f"with its own default", None, None)
    count, rows = steps(train)
    if rows is None:
        return (f"the rows reaching '{train.name}' are not known before the run, so one "
                f"optimizer step per batch cannot be shown", None, None)
    if count != 1:
        said = "an unknown number of" if count is None else str(count)
        return (f"'{train.name}' makes {said} optimizer steps per batch of at most {rows} "
                f"rows (epochs x mini-batches): after the first, its weights are no longer "
                f"those that computed {', '.join(keys)}", count, rows)
    return None, count, rows


def _candidates(plan: ExecutionPlan):
    """(node, training node, keys) for each inference call read by a training call of
    its role that may take all it writes from its own forward."""
    for train in plan.nodes:
        own = _own_keys(plan, train) if train.kind is NodeKind.TRAIN else None
        if own is None:
            continue
        for dep in train.deps:
            node = plan.node(dep)
            if (node.op is Op.CALL and node.kind is NodeKind.INFERENCE
                    and node.role == train.role and node.writes
                    and set(node.writes) <= set(own[0])
                    and all(train.input_keys.get(k) == node.name for k in node.writes)):
                yield node, train, node.writes, own[1]


def drop_unneeded(plan: ExecutionPlan, steps: StepsOf,
                  sources: Callable[[PlanNode], dict] = lambda node: {}) -> ExecutionPlan:
    """`plan` without the nodes its training calls do not need (module docstring),
    with `plan.unneeded` saying what was removed or kept and why. `sources(T)`: keys
    T takes from another column of its input (the worker's `input_sources` hook)."""
    records, drop, takes, moved = [], set(), {}, {}
    for node, train, keys, param in _candidates(plan):
        taken = sources(train)
        by_source = set(keys) <= set(taken)
        why, count, rows = _why_kept(plan, node, train, keys), None, None
        if why is None and not by_source:
            why, count, rows = _why_not_current(plan, node, train, keys, steps)
        if why is None and by_source:
            _check_sources(plan, train, {k: taken[k] for k in keys})
            why = (f"'{train.name}' takes {', '.join(f'{k} from {taken[k]}' for k in keys)} "
                   f"of its input, as its role's config asks; keep the node with "
                   f"{KEEP_OPTION}")
            drop.add(node.name)
            moved.setdefault(train.name, {}).update({k: taken[k] for k in keys})
        elif why is None:
            why = (f"'{train.name}' makes one optimizer step per batch (at most {rows} "
                   f"rows), so its {', '.join(keys)} equal its own forward's before that "
                   f"step: it takes them from there, detached; keep the node with "
                   f"{KEEP_OPTION}")
            drop.add(node.name)
            takes.setdefault(train.name, (param, []))[1].extend(keys)
        records.append(Unneeded(node, train.name, tuple(keys), node.name in drop, why))
    if not drop:
        return replace(plan, unneeded=records) if records else plan
    nodes = [_moved(n, moved.get(n.name, {}), drop) for n in plan.nodes if n.name not in drop]
    nodes = [_taking(n, *takes[n.name], drop) if n.name in takes else n for n in nodes]
    return replace(plan, nodes=nodes, stages=plan_stages(nodes), unneeded=records)


def _taking(train: PlanNode, param: str, keys: list[str], drop: set[str]) -> PlanNode:
    """The training node taking `keys` from its own forward instead of its inputs."""
    return replace(train, deps=tuple(d for d in train.deps if d not in drop),
                   reads=tuple(k for k in train.reads if k not in keys),
                   input_keys={k: w for k, w in train.input_keys.items() if k not in keys},
                   kwargs={**train.kwargs, param: tuple(keys)})


def _check_sources(plan: ExecutionPlan, train: PlanNode, taken: dict[str, str]) -> None:
    missing = [column for column in taken.values() if column not in train.input_keys]
    if missing:
        raise GraphError(plan.graph_name, [
            f"{train.where()}: takes {', '.join(f'{k} from {c}' for k, c in taken.items())} "
            f"(its role's config), but none of its inputs provides {missing}: pass the node "
            f"that writes it (the generate node) as an input, or change the setting"])


def _moved(train: PlanNode, taken: dict[str, str], drop: set[str]) -> PlanNode:
    """The training node reading the columns its keys are taken from."""
    if not taken:
        return train
    reads = tuple(dict.fromkeys(taken.get(k, k) for k in train.reads))
    return replace(train, deps=tuple(d for d in train.deps if d not in drop), reads=reads,
                   input_keys={k: w for k, w in train.input_keys.items() if k not in taken})


def unneeded_summary(plan) -> str | None:
    records = getattr(plan, "unneeded", None) or []
    return "\n".join(f"  {r.line()}" for r in records) or None


SUMMARY_SECTIONS.append(unneeded_summary)
