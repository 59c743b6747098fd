"""Where a streaming rollout's finished samples wait: on the rollout worker that
generated them, until the train side pulls them (`trainer.async_mode=streaming`).

The driver never holds a sample. A poll tells it what became whole on this worker
since the last poll — per group (`uid`: a prompt's n samples), a few numbers
(`GroupStats`: rows, versions, lengths) that are all it needs to admit a group and to
report the stream's metrics — and the rows stay here. A step's pass then takes the
admitted groups worker to worker (`take`, a task of the buffer node); an entrance
filter (DAPO's dynamic sampling) screens groups the same way and sends the kept
rows, with the filter's columns, back here (`keep`); an entrance pass without a
filter (the stream-side nodes of plan/streaming_split.py: rewards, a colocated
reference, group advantages) sends each handed-over node's rows of the group back
here under that node's name (its *producer*), row-aligned with the samples, and each
train-side buffer takes its own producer's rows.

State: `expected` (uid -> samples submitted on this worker), `partial` (uid -> the
finished rows so far), `whole` (uid -> producer -> the group's rows, not yet taken;
producer `SAMPLES` (None): the samples, or a filter's rows of them), `reported`
(whole uids not yet reported by a poll, in completion order). A group leaves when
its last producer's rows are taken. Only its methods change it; one per streaming
worker (stream_worker.py, agents/stream.py).
"""
from __future__ import annotations

from collections import OrderedDict

from hybridflow.core.batch import Batch
from hybridflow.core.group_stats import GroupStats, group_stats

__all__ = ["StreamStore", "GroupStats", "group_stats", "SAMPLES"]

SAMPLES = None  # the producer of a group's samples (the generate node's, or a filter's)


class StreamStore:
    def __init__(self, unit: str = "uid"):
        self.unit = unit
        self.expected: dict[str, int] = {}
        self.partial: dict[str, list[Batch]] = {}
        self.whole: OrderedDict[str, dict] = OrderedDict()
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
                self.whole[uid] = {SAMPLES: Batch.concat(self.partial.pop(uid))}
                self.reported.append(uid)

    def report(self) -> dict[str, tuple]:
        """{uid: GroupStats as a tuple} of the groups that became whole since the last
        report, in completion order."""
        out = {uid: group_stats(self.whole[uid][SAMPLES]).as_tuple()
               for uid in self.reported if uid in self.whole}
        self.reported = []
        return out

    def take(self, uids: list[str], leave: bool = False, producer: str | None = SAMPLES
             ) -> Batch:
        """`producer`'s rows of these whole groups, in this order; they leave the store
        unless `leave` (an entrance pass reads them first: `keep` says what stays)."""
        missing = [u for u in uids if producer not in self.whole.get(u, {})]
        if missing:
            what = "are not whole" if producer is SAMPLES else \
                f"hold no rows of '{producer}'"
            raise KeyError(f"streaming: group(s) {missing[:5]} {what} on this worker "
                           f"(held: {len(self.whole)})")
        if leave:
            parts = [self.whole[u][producer] for u in uids]
        else:
            parts = [self.whole[u].pop(producer) for u in uids]
            for uid in uids:
                if not self.whole[uid]:  # its last producer taken: the group leaves
                    del self.whole[uid]
                    self.expected.pop(uid, None)
        return Batch.concat(parts) if parts else Batch()

    def keep(self, kept: Batch | None, uids: list[str], dropped: list[str],
             producer: str | None = SAMPLES, layout: list | None = None,
             drop_samples: bool = False) -> None:
        """An entrance pass's verdict: `kept` holds `producer`'s rows of the groups
        `uids` (found by their unit column, or with `layout` [(uid, rows), ...] by
        position: row-aligned with the samples read in that order); they are held
        for `producer` (SAMPLES: they replace the samples); the `dropped` groups are
        forgotten; `drop_samples`: no train-side node reads the samples themselves."""
        index = _positions(kept, layout) if layout is not None else _by_unit(kept, self.unit)
        for uid in uids:
            if uid not in index:
                raise KeyError(f"streaming: the entrance pass kept {self.unit} {uid!r} "
                               f"but the output of '{producer or 'its filter'}' has no "
                               f"row of it")
            self.whole[uid][producer] = kept.take(index[uid])
            if drop_samples and producer is not SAMPLES:
                self.whole[uid].pop(SAMPLES, None)
        self.forget(dropped)

    def forget(self, uids) -> None:
        for uid in uids:
            self.expected.pop(uid, None)
            self.partial.pop(uid, None)
            self.whole.pop(uid, None)

    def held(self) -> int:
        return len(self.whole)

    def rows(self) -> int:
        """Finished samples held here (whole groups' and partial ones)."""
        return sum(len(g[SAMPLES]) for g in self.whole.values() if SAMPLES in g) + \
            sum(len(p) for parts in self.partial.values() for p in parts)

    def clear(self) -> None:
        self.expected.clear()
        self.partial.clear()
        self.whole.clear()
        self.reported = []


def _by_unit(kept: Batch | None, unit: str) -> dict[str, list[int]]:
    index: dict[str, list[int]] = {}
    if kept is not None and len(kept):
        for i, uid in enumerate(kept[unit]):
            index.setdefault(str(uid), []).append(i)
    return index


def _positions(kept: Batch | None, layout: list) -> dict[str, slice]:
    """{uid: (start, end)} of each group's rows in `kept`, laid out as `layout` says."""
    total = sum(int(n) for _, n in layout)
    got = 0 if kept is None else len(kept)
    if got != total:
        raise ValueError(f"streaming: an entrance node's output has {got} rows, but the "
                         f"groups it read had {total}; a stream-side node keeps its "
                         f"input's rows, one for one")
    index, start = {}, 0
    for uid, n in layout:
        index[str(uid)] = slice(start, start + int(n))
        start += int(n)
    return index
