"""What the step scheduler knows of a node's output: handles to shards that stay on
the workers (ObjectRefs on Ray, held values locally), where they live, and (once
done) their rows, columns and group hashes; and `StreamTake`, the feed of a streaming
buffer: which groups to take from which rollout worker. Plain records: no behaviour."""
from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["NodeOutput", "StreamTake"]


@dataclass
class NodeOutput:
    """A node's output left on the workers: the concatenation of `refs` in slot order."""
    node: str
    refs: list
    homes: list                    # (pool, rank) holding or owning each slot; None: no pool
    lineage: str                   # outputs of one lineage share their row partition
    on_driver: bool = False        # put by the driver (a feed or a driver fn)
    rows: list[int] | None = None  # per slot, once done
    keys: list[str] | None = None  # columns, once done
    groups: list[dict] | None = None
    nbytes: int = 0
    metrics: dict = field(default_factory=dict)
    versions: dict = field(default_factory=dict)  # policy_version -> rows, once done

    @property
    def done(self) -> bool:
        return self.rows is not None

    @property
    def num_rows(self) -> int | None:
        return None if self.rows is None else sum(self.rows)


@dataclass(frozen=True)
class StreamTake:
    """A streaming buffer's feed: the whole groups each worker of the rollout role
    holds (`shards`: (rank, uids), one output slot each, in order). The scheduler
    makes each slot a task on that worker (`FusedWorker.stream_take`), so the rows go
    from the rollout worker to the train side without the driver. `leave`: the
    groups stay in the worker's store (an entrance pass reads them). `producer`: whose
    rows of the groups (None: the samples; else a stream-side node's, kept beside
    them by the entrance pass: workers/rollout/stream_store.py)."""
    role: str
    pool: str
    shards: tuple
    leave: bool = False
    producer: str | None = None
