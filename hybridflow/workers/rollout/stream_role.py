"""What every streaming role shares (the `StreamingRole` protocol of
graph/streams.py): the whole groups it holds for the train side, in a
`StreamStore` (stream_store.py), and the shape of a poll's reply. The rollout role
(stream_worker.py: requests in its engine) and the agent role (agents/stream.py:
whole episodes) differ in how rows are made — submit, start, poll, abort — and share
how they are expected, taken, kept and reported:

- `stream_take` / `stream_keep`: a pass's tasks on the worker holding the groups
  (runtime/stream_take.py, runtime/run_long/stream_client.py `keep`), under the store's lock
  only (`_held_lock`), so they never wait for a decode step;
- `_expect`: a submission's {uid: samples} into the store (the reporting rank's);
- `stream_start`: an inline role's (no loop thread: its polls are the progress);
- `poll_reply`: the reply a poll returns (groups, busy, rows, counts, spans).

A subclass provides `_held_store()` (its store, made on first use) and, when another
thread adds rows, `_held_lock()`. The state is the subclass's.
"""
from __future__ import annotations

import contextlib

from hybridflow.core.batch import Batch
from hybridflow.workers.rollout.stream_store import StreamStore

__all__ = ["StreamRoleCalls", "poll_reply"]


def poll_reply(groups: dict, busy: bool, rows: int, counts: dict,
               spans: list | None = None) -> dict:
    """A poll's reply: {uid: GroupStats tuple} of the groups that became whole, whether
    requests are left, the samples that finished, the counters (`async/stream/*`),
    and a background loop's decode spans (wall clock) when it has them."""
    reply = {"groups": groups, "busy": busy, "rows": rows, "counts": counts}
    if spans is not None:
        reply["spans"] = spans
    return reply


class StreamRoleCalls:
    def _held_store(self) -> StreamStore:
        raise NotImplementedError(f"{type(self).__name__} must give its StreamStore")

    def _held_lock(self):
        """The lock a take or keep holds (none: every call comes from one thread)."""
        return contextlib.nullcontext()

    def _expect(self, batch: Batch, n: int) -> dict:
        """{uid: n} for a submission's prompts, expected by the store."""
        counts = {str(uid): n for uid in batch["uid"]}
        self._held_store().expect(counts)
        return counts

    def stream_start(self) -> bool:
        """No loop thread: this role makes rows inside its polls."""
        return False

    def stream_take(self, uids: list[str], leave: bool = False, producer: str | None = None
                    ) -> Batch:
        """`producer`'s rows of these whole groups (None: the samples; they leave the
        store unless `leave`)."""
        with self._held_lock():
            return self._held_store().take(list(uids), leave, producer)

    def stream_keep(self, kept: Batch | None, uids: list[str], dropped: list[str],
                    producer: str | None = None, layout: list | None = None,
                    drop_samples: bool = False) -> int:
        """An entrance pass's verdict on groups held here (StreamStore.keep); how many
        groups are held after it."""
        with self._held_lock():
            store = self._held_store()
            store.keep(kept, list(uids), list(dropped), producer, layout, drop_samples)
            return store.held()
