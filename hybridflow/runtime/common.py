"""What the scheduler and the workers share: assembling a node's input from its
producers' outputs, finishing its output, running function nodes, gather rounds'
metrics, the record of one step and the failure that names node, role and rank.
No state."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hybridflow.core.batch import Batch, as_object_array
from hybridflow.core.failure_text import traceback_cause
from hybridflow.plan.compiler import ExecutionPlan, PlanNode
from hybridflow.core.kinds import Op

__all__ = ["NodeFailure", "StepResult", "run_fn_node",
           "input_columns", "metrics_of", "as_node_batch", "NodeIO"]


class NodeFailure(RuntimeError):
    """A node failed while running; names the node, its role (or, for a function
    node run on a worker, the pool) and the rank; `rank` None: the driver. `detail`
    is the whole story (a traceback: error.log's); `cause` the one line of it a
    console shows (`Type: message` of the root cause: core/failure_text.py), worked
    out where the exception was raised when it can be."""

    def __init__(self, node: PlanNode, rank: int | None, detail: str,
                 pool: str | None = None, cause: str | None = None):
        self.node, self.rank, self.detail = node.name, rank, detail
        if node.role:
            who = f"role '{node.role}' rank {rank}"
        elif rank is not None:  # a function node that ran on a worker
            who = f"the worker of pool '{pool or node.pool}' rank {rank}"
        else:
            who = "the driver"
        self.headline = f"{node.where()} failed on {who}"
        self.cause = cause or traceback_cause(detail)
        super().__init__(f"{self.headline}:\n{detail}")

    @property
    def summary(self) -> str:
        """One line: where it failed and why (the root cause's `Type: message`)."""
        return f"{self.headline}: {self.cause}" if self.cause else self.headline


@dataclass
class StepResult:
    outputs: dict[str, Any]                 # node -> Batch (local) or NodeOutput (ray)
    metrics: dict[str, float] = field(default_factory=dict)
    node_metrics: dict[str, dict] = field(default_factory=dict)  # node -> its metrics
    rows: dict[str, int] = field(default_factory=dict)           # node -> output rows
    timeline: list[dict] = field(default_factory=list)
    driver_bytes: int = 0


def input_columns(node: PlanNode) -> list[str]:
    """Keys a node's method receives: all of them when it forwards its input."""
    if node.forwards or node.op is Op.FN and not node.reads:
        return list(node.input_keys)
    wanted = [*node.reads, *(k for k in node.optional if k in node.input_keys)]
    if node.group_by:
        wanted.append(node.group_by)
    return list(dict.fromkeys(wanted))


class NodeIO:
    """What a node reads and writes, worked out once per node (a worker keeps one per
    node it runs): the columns it takes and whose writes they must be, the columns its
    output keeps and who wrote each. Immutable after construction."""

    __slots__ = ("node", "columns", "deps", "keep", "writer_of", "rename", "writes")

    def __init__(self, node: PlanNode):
        self.node = node
        self.columns = tuple((key, node.input_keys[key]) for key in input_columns(node))
        self.deps = tuple(node.deps)
        self.keep = frozenset(node.output_keys if node.forwards else node.writes)
        self.writer_of = {k: node.output_keys.get(k, node.name) for k in self.keep}
        self.rename = tuple(node.rename.items())
        self.writes = tuple(node.writes)

    def assemble(self, outputs: dict[str, Batch]) -> Batch:
        """The node's input batch: each wanted key taken from the producer whose output
        carries the column written by the key's winning writer."""
        tensors, non_tensors, used = {}, {}, set()
        for key, writer in self.columns:
            for dep in self.deps:
                out = outputs[dep]
                columns = out.tensors if key in out.tensors else out.non_tensors
                if key not in columns:
                    continue
                writers = out.meta.get("_writers")
                if (writers.get(key, dep) if writers else dep) == writer:
                    (tensors if columns is out.tensors else non_tensors)[key] = columns[key]
                    used.add(dep)
                    break
        if len(used) > 1:  # columns of one batch agree on rows by construction
            return Batch(tensors, non_tensors)
        return Batch._trusted(tensors, {k: as_object_array(v) for k, v in non_tensors.items()},
                              None)

    def finish(self, out: Batch) -> Batch:
        """Apply renames, keep declared columns, and record who wrote each column, so
        that consumers can tell a forwarded column from an overwritten one."""
        if type(out) is not Batch:
            out = as_node_batch(out)
        for old, new in self.rename:
            if old in out:
                out[new] = out[old]
                out.drop(old)
        keep, tensors, non_tensors = self.keep, out.tensors, out.non_tensors
        missing = [k for k in self.writes if k not in tensors and k not in non_tensors]
        if missing and len(out):
            raise ValueError(f"{self.node.where()} returned no column(s) {missing}; "
                             f"its declaration says it writes {list(self.writes)}")
        # copies of the column dicts: the method's own Batch may be kept and changed
        tensors = dict(tensors) if keep.issuperset(tensors) else \
            {k: v for k, v in tensors.items() if k in keep}
        non_tensors = dict(non_tensors) if keep.issuperset(non_tensors) else \
            {k: v for k, v in non_tensors.items() if k in keep}
        writer_of = self.writer_of
        meta = {"metrics": out.meta.get("metrics", {}),
                "_writers": {k: writer_of[k] for k in (*tensors, *non_tensors)}}
        return Batch._trusted(tensors, non_tensors, meta)


def as_node_batch(value: Any) -> Batch:
    """A node's output from what its dispatch mode collected. Modes that collect a
    list (broadcast: every rank ran the same input) keep the first rank's Batch."""
    if isinstance(value, (list, tuple)):
        value = next((v for v in value if isinstance(v, Batch)), None)
    return Batch() if value is None else value


def upstream_nodes(plan: ExecutionPlan, name: str) -> list[PlanNode]:
    """`name` and every node it depends on, in plan (topological) order."""
    wanted, stack = set(), [name]
    while stack:
        current = stack.pop()
        if current not in wanted:
            wanted.add(current)
            stack.extend(plan.node(current).deps)
    return [n for n in plan.nodes if n.name in wanted]


def sum_round_metrics(rounds: list[dict]) -> dict:
    """Metrics of a node re-run by a gather: counts (`*_total`, the one rule of
    `core.metric_names.is_summed`) add up over rounds, others keep the mean."""
    from hybridflow.graph.dispatch import merge_metrics
    return merge_metrics(rounds)


def finish_gather(node: PlanNode, pieces: list[Batch], rounds: int) -> Batch:
    """Concatenate the rounds' rows and keep the first `until`."""
    until = node.kwargs["until"]
    merged = Batch.concat(pieces)
    rows = len(merged)
    out = merged.take(slice(0, until)) if rows > until else merged
    out.meta = {"metrics": {f"{node.name}/extra_rounds": float(rounds),
                            f"{node.name}/rows": float(min(rows, until)),
                            f"{node.name}/short_rows": float(max(until - rows, 0))},
                "_writers": merged.meta.get("_writers", {})}
    return out


def run_fn_node(node: PlanNode, batch: Batch) -> Batch:
    return node.fn(batch, **node.kwargs)


def metrics_of(out: Any) -> dict:
    meta = getattr(out, "meta", None) or {}
    return dict(meta.get("metrics", {}))
