"""The progress rule of a run's waits: a step that admits no trainable row stops the run.

Every wait of a step is bounded by draws, not by time: a gather re-draws at most
`max_rounds` extra times (gather_rounds.py), a streaming step waits for at most the
groups of `max_rounds + 1` batches to be dropped by its entrance filter (run_long/stream_source.py),
and a pipelined batch is one gather's output. When the bound is reached with no row
kept, training would run on 0 rows (an update that changes nothing, with no metric)
or wait forever; instead the run stops with `NoProgressError`, naming the filter, what
it saw and dropped, and the draws it took. `empty_training_inputs` is the same rule
after a pass, for a training node whatever emptied its input (a filter without a
gather). Stateless.
"""
from __future__ import annotations

__all__ = ["NoProgressError", "no_rows_kept", "empty_training_inputs"]


class NoProgressError(RuntimeError):
    """A step that cannot train: every row was dropped within the wait's bound."""

    def __init__(self, step: int | None, message: str, node: str | None = None):
        self.node, self.rank = node, None
        prefix = f"step {step}: " if step is not None else ""
        super().__init__(prefix + message)


def no_rows_kept(step: int | None, filter_where: str, dropped: int, seen: int,
                 draws: int, max_rounds: int, unit: str, node: str | None = None
                 ) -> NoProgressError:
    """The error of a wait that reached its bound with nothing kept."""
    return NoProgressError(step, (
        f"no trainable row: the filter {filter_where} dropped "
        f"{f'{dropped} of the {seen}' if seen else 'every one of the'} "
        f"{unit} drawn for this step, in {draws} draw(s) (the bound: max_rounds="
        f"{max_rounds} extra draws), so the step cannot train and the run stops; a "
        f"scorer that gives every sample the same score makes every group uniform: "
        f"check the scorer (reward.*) and the filter's settings"), node)


def empty_training_inputs(step: int | None, plan, rows: dict[str, int]) -> None:
    """Raise when a training node of `plan` got 0 rows in a pass whose `rows` (node ->
    output rows) say so, naming the first node on its input path that emptied it."""
    for node in plan.nodes:
        if not node.kind.trains or not node.deps or plan.node(node.deps[0]).kind.trains:
            continue
        if rows.get(node.deps[0], 1) != 0:
            continue
        culprit = _first_empty(plan, node.deps[0], rows)
        source = plan.node(culprit)
        before = [rows.get(d, 0) for d in source.deps]
        raise NoProgressError(step, (
            f"{node.where()} would train on 0 rows: {source.where()} "
            f"returned 0 of its {max(before, default=0)} input rows, so the step "
            f"cannot train and the run stops (an update on no rows changes nothing); "
            f"check what drops them, or gather them (g.gather(..., until=, max_rounds=))"),
            node.name)


def _first_empty(plan, name: str, rows: dict[str, int]) -> str:
    """The upstream-most node with 0 rows whose own inputs had rows."""
    node = plan.node(name)
    for dep in node.deps:
        if rows.get(dep, 1) == 0:
            return _first_empty(plan, dep, rows)
    return name
