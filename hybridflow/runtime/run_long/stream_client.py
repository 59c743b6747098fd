"""The driver's end of a streaming rollout (`trainer.async_mode=streaming`): which rank
generates which prompt, the calls that drive the role's stream, and what they cost.

Each engine (a tp group of `tp` ranks, or one rank) is a *share*: prompt i of a draw
goes to share i mod (world / tp) and stays there (a stale group is generated again on
the share that holds it), so a prompt is sent to the ranks that generate it and no
other. Only a share's first rank reports and holds rows
(workers/rollout/stream_worker.py). A poll asks every rank (a tp group steps in
lockstep) and receives per-group numbers (`GroupStats` tuples); the rows stay on the
workers until a pass takes them (`take`: a `StreamTake` feed per buffer, tasks on the
holding workers) or an entrance pass's verdict is sent back to them (`keep`: a node's
output shards go worker to worker).

Every byte these calls move through the driver (prompts sent, replies, uids) is
counted in `bytes` (the runtime's `value_bytes`: 0 on the local runtime, where nothing
crosses a process); the stream source (stream_source.py) adds them to `engine/driver_bytes`.

State: `home` (uid -> the rank holding its group), `bytes` since the last `drain`.
Only its methods change them; the stream source owns one.
"""
from __future__ import annotations

from hybridflow.core.batch import Batch
from hybridflow.core.failure_text import cause_line
from hybridflow.graph.streams import StreamCall
from hybridflow.plan.compiler import ExecutionPlan, PlanNode
from hybridflow.runtime.common import NodeFailure
from hybridflow.runtime.outputs import StreamTake
from hybridflow.runtime.worker_shell import ShardTask

__all__ = ["StreamClient"]


class StreamClient:
    def __init__(self, runtime, plan: ExecutionPlan, gen: PlanNode):
        self.runtime, self.gen = runtime, gen
        self.role, self.pool = gen.role, plan.placement.roles[gen.role]
        self.world = int(runtime.pool_size(self.pool))
        self.layout = plan.placement.layout(gen.role, world=self.world,  # share = dp slot
                                            generating=True)
        self.home: dict[str, int] = {}
        self.bytes = 0

    @property
    def shares(self) -> int:
        """Engines of the role: one per dp slot of its layout."""
        return self.layout.dp

    # ------------------------------------------------------------------ calls
    def submit(self, batch: Batch, **options) -> dict[str, int]:
        """Each prompt to the ranks of its share (new prompts: by position, stale ones:
        where they were); {uid: samples expected} from the reporting ranks."""
        uids = [str(u) for u in batch["uid"]]
        per_share: dict[int, list[int]] = {}
        for i, uid in enumerate(uids):
            rank = self.home.setdefault(uid, self.layout.row_group(i % self.shares)[0])
            per_share.setdefault(self.layout.dp_rank(rank), []).append(i)
        args: list = [None] * self.world
        for share, index in per_share.items():
            rows = batch.take(index)
            for rank in self.layout.row_group(share):
                args[rank] = (rows,)
                self.bytes += self.runtime.value_bytes(rows)
        counts: dict[str, int] = {}
        for reply in self._call_each(StreamCall.SUBMIT, args, **options):
            if reply:
                counts.update(reply)
        return counts

    def poll(self, wait_s: float = 0.0, want: int = 1) -> list[dict]:
        """Every rank's reply (groups that became whole, busy, rows, counters); a
        background rank waits up to `wait_s` for its share of the `want` groups."""
        share = -(-max(1, want) // self.shares)  # ceil: groups each engine is asked for
        return self._call_each(StreamCall.POLL, [(wait_s, share)] * self.world)

    def take(self, uids: list[str], leave: bool = False,
             producer: str | None = None) -> StreamTake:
        """The feed of a buffer node taking `producer`'s rows (None: the samples) of
        these whole groups, in this order per holding rank (a slot per rank, in order
        of first appearance)."""
        return self.takes(uids, [producer], leave)[0]

    def takes(self, uids: list[str], producers: list, leave: bool = False) -> list:
        """One `StreamTake` per producer of these groups (the buffers of one pass);
        unless `leave`, the groups are then no longer held (each take empties its
        producer's rows on the worker; the last one the group)."""
        by_rank: dict[int, list[str]] = {}
        for uid in uids:
            by_rank.setdefault(self.home[uid], []).append(uid)
        if not leave:
            for uid in uids:
                self.home.pop(uid, None)
        shards = tuple((rank, tuple(us)) for rank, us in by_rank.items())
        return [StreamTake(self.role, self.pool, shards, leave, p) for p in producers]

    def keep(self, plan: ExecutionPlan, node: PlanNode, shards: list, kept: list[str],
             dropped: list[str], **how) -> None:
        """An entrance pass's verdict to the ranks holding the groups: a node's output
        `shards` (handles: worker to worker) replace the kept groups' samples there (a
        filter's) or are held beside them (`how`: producer, layout, drop_samples:
        StreamStore.keep); the dropped ones are forgotten."""
        ranks: dict[int, tuple[list, list]] = {}
        for uid in kept:
            ranks.setdefault(self.home[uid], ([], []))[0].append(uid)
        for uid in dropped:
            ranks.setdefault(self.home.pop(uid), ([], []))[1].append(uid)
        metas = []
        for rank, (keep, drop) in ranks.items():
            task = ShardTask(self.runtime.node_id(plan, node, self.pool, rank), {})
            self.bytes += self.runtime.value_bytes([keep, drop, how])
            try:
                _, meta = self.runtime.submit(node, StreamCall.KEEP, self.pool, rank, 2, task,
                                              [self.role, keep, drop, how, *shards])
            except NodeFailure as err:
                raise self._named(StreamCall.KEEP, err) from None
            metas.append(meta)
        try:
            self.bytes += self.runtime.resolve(metas)[1]
        except Exception as err:  # noqa: BLE001 - named by the generate node
            raise NodeFailure(self.gen, None, f"{self.role}.{StreamCall.KEEP}: {err}",
                              cause=f"{self.role}.{StreamCall.KEEP}: {cause_line(err)}"
                              ) from None

    def start(self) -> list:
        return self._call_each(StreamCall.START, [()] * self.world)

    def abort(self) -> list:
        self.home.clear()
        return self._call_each(StreamCall.ABORT, [()] * self.world)

    def forget(self) -> None:
        """A resumed run: nothing is held anywhere (the workers were aborted or new)."""
        self.home.clear()

    def drain(self) -> int:
        """Bytes through the driver since the last drain."""
        out, self.bytes = self.bytes, 0
        return out

    def _call_each(self, call: str, args: list, **kwargs) -> list:
        """A call of the stream's protocol on the role's ranks. A failure (a worker
        process killed, the engine loop's error) names the generate node those calls
        serve, with the role and rank: the user's graph has no node for the call."""
        try:
            replies = self.runtime.call_each(self.role, call, args, **kwargs)
        except NodeFailure as err:
            raise self._named(call, err) from None
        self.bytes += sum(self.runtime.value_bytes(r) for r in replies if r is not None)
        return replies

    def _named(self, call: str, err: NodeFailure) -> NodeFailure:
        """A worker's failure in `call`, named by the generate node it serves."""
        return NodeFailure(self.gen, err.rank, f"{self.role}.{call}: {err.detail}",
                           cause=f"{self.role}.{call}: {err.cause}")
