"""Reshard planning for the step scheduler: which rows of which input shards each
slot (a chunk of a dispatch mode's `SlotLayout`) of a node takes.

Pure functions over `NodeOutput` handles (`scheduler`): no Ray calls, no state. An
input is described per dep as a `DepInput` of `Piece`s (a shard reference and an
optional row range), concatenated and then, for a regroup, indexed by the worker.
The answer is None while a reshard needs row counts that are not known yet (an
input is not done).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from hybridflow.core.batch import Batch, split_indices
from hybridflow.plan.compiler import PlanNode
from hybridflow.runtime.common import NodeFailure
from hybridflow.runtime.worker_shell import DepInput, Piece

if TYPE_CHECKING:
    from hybridflow.runtime.outputs import NodeOutput

__all__ = ["aligned", "slot_inputs", "grouped_inputs", "whole_inputs"]


def aligned(deps: list[NodeOutput], slots: int) -> bool:
    """Shard i of every dep holds the same rows: same slot count and one lineage, or
    equal row counts once they are known."""
    if any(len(d.refs) != slots for d in deps):
        return False
    if len({d.lineage for d in deps}) <= 1:
        return True
    return all(d.done for d in deps) and len({tuple(d.rows) for d in deps}) == 1


def slot_inputs(node: PlanNode, deps: list[NodeOutput], slots: int,
                keeps_partition: bool | None = None):
    """Per slot, the DepInput of every supplying dep, and the output's lineage;
    None while row counts needed for a reshard are unknown. `keeps_partition`:
    the node's `row_effect.keeps_partition`, when the caller knows it already."""
    if aligned(deps, slots):
        inputs = [{d.node: DepInput((Piece(d.refs[s]),)) for d in deps}
                  for s in range(slots)]
        if keeps_partition is None:  # e.g. not generate's n samples
            keeps_partition = node.row_effect.keeps_partition
        lineage = deps[0].lineage if deps and keeps_partition else node.name
        return inputs, lineage
    if not all(d.done for d in deps):
        return None
    inputs = [{} for _ in range(slots)]
    for dep in deps:
        offsets = np.cumsum([0, *dep.rows])
        for s, rows in enumerate(np.array_split(np.arange(offsets[-1]), slots)):
            lo, hi = (int(rows[0]), int(rows[-1]) + 1) if len(rows) else (0, 0)
            inputs[s][dep.node] = _range_pieces(dep, offsets, lo, hi)
    return inputs, node.name


def grouped_inputs(node: PlanNode, deps: list[NodeOutput], slots: int):
    """For a `group_by` function: shards that hold whole groups run as they are;
    otherwise the rows are regrouped with `split(group_by=...)` semantics."""
    if not all(d.done for d in deps):
        return None
    key = node.group_by
    keyed = next((d for d in deps if any(key in g for g in d.groups)), None)
    if keyed is None:
        raise NodeFailure(node, None, f"group_by key '{key}' reached the node from none "
                                      f"of its inputs")
    per_slot = [g.get(key, np.empty(0, np.uint64)) for g in keyed.groups]
    whole = sum(len(np.unique(h)) for h in per_slot) == \
        len(np.unique(np.concatenate(per_slot)))
    if whole and aligned(deps, slots) and len(keyed.refs) == slots:
        return slot_inputs(node, deps, slots)
    hashes = np.concatenate(per_slot)
    runs = 1 + int(np.count_nonzero(hashes[1:] != hashes[:-1])) if len(hashes) else 0
    if runs != len(np.unique(hashes)):
        # regrouping would hand the rows back in another order than the one every
        # other input of the node's consumers has: refuse rather than misalign them
        raise NodeFailure(node, None, f"the rows of a '{key}' group are not next to each "
                                      f"other in its input, and they span several shards; "
                                      f"keep each group's rows together before this node")
    ids = Batch(non_tensors={key: hashes})
    inputs = [{} for _ in range(slots)]
    for s, index in enumerate(split_indices(ids, slots, group_by=key)):
        for dep in deps:
            inputs[s][dep.node] = _index_pieces(dep, index)
    return inputs, node.name


def whole_inputs(deps: list[NodeOutput]) -> dict:
    """Every shard of every dep, for a rank that takes the whole input."""
    return {d.node: DepInput(tuple(Piece(r) for r in d.refs)) for d in deps}


def _range_pieces(dep: NodeOutput, offsets, lo: int, hi: int) -> DepInput:
    """Rows [lo, hi) of a dep's concatenated shards; an empty range keeps the columns."""
    pieces = []
    for j, ref in enumerate(dep.refs):
        a, b = max(lo, offsets[j]), min(hi, offsets[j + 1])
        if a < b:
            whole = a == offsets[j] and b == offsets[j + 1]
            pieces.append(Piece(ref, None if whole else slice(int(a - offsets[j]),
                                                               int(b - offsets[j]))))
    return DepInput(tuple(pieces) or (Piece(dep.refs[0], slice(0, 0)),))


def _index_pieces(dep: NodeOutput, index: np.ndarray) -> DepInput:
    """Rows `index` (any order) of a dep's concatenated shards."""
    offsets = np.cumsum([0, *dep.rows])
    used = sorted({int(np.searchsorted(offsets, i, side="right") - 1) for i in index})
    if not used:
        return DepInput((Piece(dep.refs[0], slice(0, 0)),))
    base = {j: int(sum(dep.rows[k] for k in used if k < j)) for j in used}
    shard = np.searchsorted(offsets, index, side="right") - 1
    local = np.array([base[int(j)] + int(i - offsets[j]) for i, j in zip(index, shard)],
                     dtype=np.int64)
    return DepInput(tuple(Piece(dep.refs[j]) for j in used), local)
