"""Where a streaming rollout's finished samples wait: on the rollout worker that
generated them, until the train side pulls them (`trainer.async_mode=streaming`).

The driver never holds a sample. A poll tells it what became whole on this worker
since the last poll — per group (`uid`: a prompt's n samples), a few numbers
(`GroupStats`: rows, versions, lengths) that are all it needs to admit a group and to
report the stream's metrics — and the rows stay here. A step's pass then takes the
admitted groups worker to worker (`take`, a task of the buffer node); an entrance
filter (DAPO's dynamic sampling) screens groups the same way and sends the kept
rows, with the filter's columns, back here (`keep`).

State: `expected` (uid -> samples submitted on this worker), `partial` (uid -> the
finished rows so far), `whole` (uid -> the group's rows, whole, not yet taken),
`reported` (whole uids not yet reported by a poll, in completion order). Only its
methods change it; one per streaming worker (stream_worker.py, agents/stream.py).
"""
from __future__ import annotations

from collections import OrderedDict

from hybridflow.core.batch import Batch
from hybridflow.core.group_stats import GroupStats, group_stats

__all__ = ["StreamStore", "GroupStats", "group_stats"]


class StreamStore:
    def __init__(self, unit: str = "uid"):
        self.unit = unit
        self.expected: dict[str, int] = {}
        self.partial: dict[str, list[Batch]] = {}
        self.whole: OrderedDict[str, Batch] = OrderedDict()
        self.reported: list[str] = []

    def expect(self, counts: dict[str, int]) -> None:
        """`counts[uid]` samples were submitted here (a re-submission forgets the
        group's earlier rows)."""
        for uid, n in counts.items():
            self.expected[uid] = int(n)
            self.partial.pop(uid, None)
            self.whole.pop(uid, None)
            if uid in self.reported:
                self.reported.remove(uid)

    def add(self, rows: Batch | None) -> None:
        """Finished samples (any groups, any order); rows of a group no longer
        expected (aborted, re-submitted) are dropped."""
        if rows is None or not len(rows):
            return
        by_uid: dict[str, list[int]] = {}
        for i, uid in enumerate(rows[self.unit]):
            by_uid.setdefault(str(uid), []).append(i)
        for uid, index in by_uid.items():
            if uid not in self.expected:
                continue
            parts = self.partial.setdefault(uid, [])
            parts.append(rows.take(index))
            if sum(len(p) for p in parts) >= self.expected[uid]:
                self.whole[uid] = Batch.concat(self.partial.pop(uid))
                self.reported.append(uid)

    def report(self) -> dict[str, tuple]:
        """{uid: GroupStats as a tuple} of the groups that became whole since the last
        report, in completion order."""
        out = {uid: group_stats(self.whole[uid]).as_tuple() for uid in self.reported
               if uid in self.whole}
        self.reported = []
        return out

    def take(self, uids: list[str], leave: bool = False) -> Batch:
        """The rows of these whole groups, in this order; they leave the store unless
        `leave` (an entrance filter screens them first: `keep` says what stays)."""
        missing = [u for u in uids if u not in self.whole]
        if missing:
            raise KeyError(f"streaming: group(s) {missing[:5]} are not whole on this "
                           f"worker (held: {len(self.whole)})")
        if leave:
            parts = [self.whole[u] for u in uids]
        else:
            parts = [self.whole.pop(u) for u in uids]
            for uid in uids:
                self.expected.pop(uid, None)
        return Batch.concat(parts) if parts else Batch()

    def keep(self, kept: Batch | None, uids: list[str], dropped: list[str]) -> None:
        """An entrance filter's verdict: the groups `uids` are replaced by the filter's
        rows of them (`kept`), the `dropped` ones are forgotten."""
        index: dict[str, list[int]] = {}
        if kept is not None and len(kept):
            for i, uid in enumerate(kept[self.unit]):
                index.setdefault(str(uid), []).append(i)
        for uid in uids:
            if uid not in index:
                raise KeyError(f"streaming: the entrance filter kept {self.unit} {uid!r} "
                               f"but its output has no row of it")
            self.whole[uid] = kept.take(index[uid])
        self.forget(dropped)

    def forget(self, uids) -> None:
        for uid in uids:
            self.expected.pop(uid, None)
            self.partial.pop(uid, None)
            self.whole.pop(uid, None)

    def held(self) -> int:
        return len(self.whole)

    def clear(self) -> None:
        self.expected.clear()
        self.partial.clear()
        self.whole.clear()
        self.reported = []
