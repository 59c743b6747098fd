"""DAPO's bound on a gather's wait (dynamic sampling: `g.gather(node, until=,
max_rounds=)`), one object for both places that wait on a filter:

- a gather node's rounds (gather_rounds.py): the nodes upstream of the gathered one
  re-run on fresh draws, at most `max_rounds` extra rounds (`may_draw`);
- a streaming buffer's entrance filter (run_long/stream_source.py): a round is one
  batch's worth of groups (`per_round`, the groups a step trains); a step that saw
  more than `max_rounds` rounds' worth dropped trains the kept groups it holds
  (`spent`), and one that holds none once the groups in flight at its start and
  `max_rounds + 1` rounds' worth more were dropped cannot train (`limit`).

Either way a wait that reaches its bound with no row kept stops the run
(`no_progress`: progress.py's `NoProgressError`, naming the filter and the bound).
Frozen; read from the gather node's declaration once.
"""
from __future__ import annotations

from dataclasses import dataclass

from hybridflow.plan.compiler import PlanNode
from hybridflow.runtime.progress import NoProgressError, no_rows_kept

__all__ = ["DrawBound"]


@dataclass(frozen=True)
class DrawBound:
    max_rounds: int     # extra rounds after the first (the gather's `max_rounds`)
    per_round: int = 1  # what one round draws, in the waiter's unit (a stream: groups)

    @classmethod
    def of(cls, gather: PlanNode, per_round: int = 1) -> "DrawBound":
        """The bound a gather node declares (the compiler checked max_rounds >= 0)."""
        return cls(int(gather.kwargs["max_rounds"]), int(per_round))

    def may_draw(self, extra_rounds: int) -> bool:
        """Whether a gather may run another round after `extra_rounds` extra ones."""
        return extra_rounds < self.max_rounds

    def spent(self, dropped: int) -> bool:
        """More than `max_rounds` rounds' worth dropped since the wait began: the step
        takes what it holds (a stream's short step)."""
        return dropped > self.max_rounds * self.per_round

    def limit(self, in_flight: int) -> int:
        """How many dropped with none kept stop the wait: the `in_flight` at its start
        and `max_rounds + 1` rounds' worth more (the progress rule)."""
        return (self.max_rounds + 1) * self.per_round + in_flight

    def no_progress(self, step: int | None, filter_where: str, dropped: int, seen: int,
                    draws: int, unit: str, node: str | None = None) -> NoProgressError:
        """The error of a wait that reached this bound with nothing kept."""
        return no_rows_kept(step, filter_where, dropped, seen, draws, self.max_rounds,
                            unit, node)
