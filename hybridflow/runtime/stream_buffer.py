"""The streaming buffer's contents (`trainer.async_mode=streaming`): samples enter as
they finish, whole groups leave.

A group is the buffer's unit (`uid`: a prompt's n samples, what GRPO's advantages
need together). Samples of a group wait in `partial` until all that were submitted
for it have finished; the group then becomes *whole* and joins `whole` in the order
groups completed. `take(n, trained, k)` releases the first n whole groups that the
admission rule accepts — every sample's `policy_version` (the version of the weights
that sampled its oldest token) >= trained - k — and returns the groups it refuses
(stale: their prompts are generated again, never trained stale and never lost).

With an entrance filter (`screened`: DAPO's dynamic sampling, stream_entrance.py) a
group that becomes whole waits in `arrived` until the scheduler screens it:
`arrivals()` hands the groups over, `settle(kept, dropped)` takes the filter's verdict
(kept groups join `whole` with the filter's rows, dropped ones are forgotten).

State: `expected` (uid -> samples submitted), `partial` (uid -> finished rows so
far), `arrived` (uid -> whole rows not yet screened; screened buffers only), `whole`
(uid -> the group's rows, in completion order). Only its methods change it; the
streaming scheduler owns one.
"""
from __future__ import annotations

from collections import OrderedDict

from hybridflow.core.batch import Batch

__all__ = ["GroupBuffer"]


class GroupBuffer:
    def __init__(self, unit: str = "uid", screened: bool = False):
        self.unit, self.screened = unit, screened
        self.expected: dict[str, int] = {}
        self.partial: dict[str, list[Batch]] = {}
        self.arrived: OrderedDict[str, Batch] = OrderedDict()
        self.whole: OrderedDict[str, Batch] = OrderedDict()

    def expect(self, counts: dict[str, int]) -> None:
        """`counts[uid]` samples were submitted for each group (a re-submission resets)."""
        for uid, n in counts.items():
            self.expected[uid] = int(n)
            self.partial.pop(uid, None)
            self.arrived.pop(uid, None)
            self.whole.pop(uid, None)

    def add(self, rows: Batch) -> None:
        """Finished samples (any groups, any order)."""
        uids = [str(u) for u in rows[self.unit]]
        by_uid: dict[str, list[int]] = {}
        for i, uid in enumerate(uids):
            by_uid.setdefault(uid, []).append(i)
        for uid, index in by_uid.items():
            if uid not in self.expected:
                raise RuntimeError(f"streaming buffer: finished samples of {self.unit} "
                                   f"{uid!r}, which was never submitted (or was trained)")
            parts = self.partial.setdefault(uid, [])
            parts.append(rows.take(index))
            if sum(len(p) for p in parts) >= self.expected[uid]:
                done = self.arrived if self.screened else self.whole
                done[uid] = Batch.concat(self.partial.pop(uid))

    def arrivals(self) -> list[tuple[str, Batch]]:
        """The whole groups waiting to be screened, in completion order (handed over:
        `settle` says what becomes of them)."""
        out = list(self.arrived.items())
        self.arrived.clear()
        return out

    def settle(self, kept: list[tuple[str, Batch]], dropped: list[str]) -> None:
        """The entrance filter's verdict: kept groups (with the filter's rows) become
        whole, in the order given; dropped ones are forgotten."""
        for uid, rows in kept:
            self.whole[uid] = rows
        for uid in dropped:
            del self.expected[uid]

    def take(self, n: int, trained: int, k: int,
             short: bool = False) -> tuple[list[tuple[str, Batch]], list[str]]:
        """(the first n admissible whole groups, or [] when fewer are whole — `short`:
        as many as there are, if any; the stale groups removed)."""
        stale = [uid for uid, rows in self.whole.items()
                 if int(rows["policy_version"].min()) < trained - k]
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
        self.partial.clear()
        self.arrived.clear()
        self.whole.clear()
