"""The buffer's ledger, in every async mode: which units are whole, with their
numbers, never their rows; the one admission rule.

A unit is what the buffer admits whole: when streaming, a group (`uid`: a prompt's n
samples, what GRPO's advantages need together); when pipelined, a batch (its rows
left on the workers by the pass that made them, pass_source.py). A streamed group's
samples wait on the rollout worker that generated them (workers/rollout/
stream_store.py) until all n have finished; the worker's next poll then reports the
group whole with its `GroupStats` (rows, oldest version, sums), and it joins `whole`
here in the order groups completed (a pipelined batch joins whole when its pass is
done). `take(n, trained, k)` releases the first n whole units that the admission
rule (`admits`) accepts — every row's `policy_version` (the version of the weights
that sampled its oldest token) >= trained - k, read from the stats — and returns the
units it refuses (stale: a group's prompts are generated again, never trained stale
and never lost; a pipelined batch cannot be stale by construction, and is an error).

With an entrance filter (`screened`: DAPO's dynamic sampling, stream_entrance.py) a
group that becomes whole waits in `arrived` until the scheduler screens it:
`arrivals()` hands the groups over, `settle(kept, dropped)` takes the filter's verdict
(kept groups join `whole`, dropped ones are forgotten).

State: `expected` (uid -> samples submitted), `arrived` (uid -> stats, whole, not yet
screened; screened buffers only), `whole` (uid -> stats, in completion order). Only
its methods change it; the run scheduler's source owns one.
"""
from __future__ import annotations

from collections import OrderedDict

from hybridflow.core.group_stats import GroupStats

__all__ = ["GroupBuffer", "GroupStats", "admits"]


def admits(stats: GroupStats, trained: int, k: int) -> bool:
    """The admission rule: every row sampled by weights at most k updates behind the
    trained version (a unit without a known version — weights not loaded yet — is
    admitted)."""
    return not stats.rows or stats.min_version >= trained - k


class GroupBuffer:
    def __init__(self, unit: str = "uid", screened: bool = False):
        self.unit, self.screened = unit, screened
        self.expected: dict[str, int] = {}
        self.arrived: OrderedDict[str, GroupStats] = OrderedDict()
        self.whole: OrderedDict[str, GroupStats] = OrderedDict()

    def expect(self, counts: dict[str, int]) -> None:
        """`counts[uid]` samples were submitted for each group (a re-submission resets)."""
        for uid, n in counts.items():
            self.expected[uid] = int(n)
            self.arrived.pop(uid, None)
            self.whole.pop(uid, None)

    def add(self, groups: dict[str, tuple]) -> None:
        """Groups a worker reported whole: {uid: GroupStats or its tuple}."""
        for uid, stats in groups.items():
            if uid not in self.expected:
                raise RuntimeError(f"streaming buffer: a worker reported {self.unit} "
                                   f"{uid!r} whole, which was never submitted (or was "
                                   f"trained)")
            stats = stats if isinstance(stats, GroupStats) else GroupStats(*stats)
            if stats.rows < self.expected[uid]:
                raise RuntimeError(f"streaming buffer: {self.unit} {uid!r} reported with "
                                   f"{stats.rows} of its {self.expected[uid]} samples")
            (self.arrived if self.screened else self.whole)[uid] = stats

    def arrivals(self) -> list[tuple[str, GroupStats]]:
        """The whole groups waiting to be screened, in completion order (handed over:
        `settle` says what becomes of them)."""
        out = list(self.arrived.items())
        self.arrived.clear()
        return out

    def settle(self, kept: list[tuple[str, GroupStats]], dropped: list[str]) -> None:
        """The entrance filter's verdict: kept groups become whole, in the order given;
        dropped ones are forgotten."""
        for uid, stats in kept:
            self.whole[uid] = stats
        for uid in dropped:
            del self.expected[uid]

    def take(self, n: int, trained: int, k: int,
             short: bool = False) -> tuple[list[tuple[str, GroupStats]], list[str]]:
        """(the first n admissible whole groups, or [] when fewer are whole — `short`:
        as many as there are, if any; the stale groups removed)."""
        stale = [uid for uid, stats in self.whole.items() if not admits(stats, trained, k)]
        for uid in stale:
            del self.whole[uid]
            del self.expected[uid]
        if short:
            n = min(n, len(self.whole))
        if not n or len(self.whole) < n:
            return [], stale
        taken = [self.whole.popitem(last=False) for _ in range(n)]
        for uid, _ in taken:
            del self.expected[uid]
        return taken, stale

    def held(self) -> int:
        """Whole groups waiting."""
        return len(self.whole)

    def clear(self) -> None:
        self.expected.clear()
        self.arrived.clear()
        self.whole.clear()
