"""The rollout role's streaming calls (`trainer.async_mode=streaming`: the
`StreamingRole` protocol of graph/streams.py), driven by the run scheduler's stream
source (runtime/run_long/stream_source.py), not graph methods: no plan node runs
them. Finished samples stay here (`stream_store.StreamStore`) until the train side
pulls them: the driver sees per-group numbers, never rows. Take, keep and the
reply's shape are every streaming role's (stream_role.py).

- `stream_submit(batch, **options)`: the prompts the driver sent to this rank (its
  share: a prompt's n samples stay on one engine), repeated n times, queued in the
  engine (`StreamingEngine.submit`). An engine over a tp group of ranks (`engine.tp`
  > 1): every rank of the group is sent the group's prompts and queues them, and only
  the group's first rank reports and keeps rows.
- `stream_poll(wait_s)`: inline mode (the local runtime, or a rollout sharing the
  actor's process) runs `rollout.stream_poll_steps` decode steps; background mode
  (`stream_start()`, Ray with the rollout on its own pool) waits up to `wait_s` for
  the engine loop, running on its own thread, to finish a group (no busy-wait on the
  driver). Either way the finished rows go into the store and the reply says which
  groups became whole, with their `GroupStats`.
- `stream_take(uids, leave, producer)`: those groups' rows of one producer (a task of
  a streaming buffer node, runtime/scheduler.py: the rows go worker to worker);
  `stream_keep(kept, uids, dropped, producer, layout)`: an entrance pass's verdict (a
  filter's rows replace the kept groups' samples; a stream-side node's rows are held
  beside them under its name).
- `stream_abort()`: drop what is not finished (the end of a run).

A tp group steps inline only (`stream_start` starts no thread for it): its ranks must
run vLLM's collectives in one order, which calls from the driver give (each rank gets
them in the order sent) and a thread per rank, racing the weight loads, would not.

Weights: a colocated engine is refreshed to the actor's weights and version before
each inline poll (for the `hf` engine that shares the module, the version only); a
rollout with its own weights receives them through `rollout.load_weights` (the plan's
weight sync), which takes `stream_lock`, so a load lands between two decode steps of
the background loop, never inside one.

Two locks, taken in this order when both are: `stream_lock`, the engine's (a decode
step, a submit, a weight load), and the store's (`_store_lock`, with the condition a
waiting poll sleeps on: signalled when a group becomes whole or the engine goes
idle). A take or a keep (a pass's task) takes only the store's, so it never waits for
a decode step; the loop adds a step's finished rows, and says whether requests are
left (`_stream_busy`, with the engine's counters as they were then), under both, so
a poll that finds no group and no request in flight is right that none is coming.

State (per worker): the two locks, the store, the background thread and its stop
flag, the error it died of (re-raised by the next poll), the counters (seconds
decoding and refreshing weights, tokens) and the loop's decode spans since the last
poll (`_stream_spans`: wall-clock [start, end] pairs, merged; the timeline's busy
time of the rollout pool counts them, not the loop's waits).
"""
from __future__ import annotations

import threading
import time

from hybridflow.core.batch import Batch
from hybridflow.workers.rollout.engine import check_streaming
from hybridflow.workers.rollout.generation import sampling_options
from hybridflow.workers.rollout.stream_role import StreamRoleCalls, poll_reply
from hybridflow.workers.rollout.stream_store import StreamStore
from hybridflow.workers.rollout.weights import refresh_engine

__all__ = ["StreamCalls"]

# decode steps closer than this make one span; a reply holds at most MAX_SPANS
SPAN_GAP_S, MAX_SPANS = 0.002, 64


class StreamCalls(StreamRoleCalls):
    """Mixed into RolloutWorker: needs `engine`, `rollout_cfg`, `ctx`, `_host()`."""

    @property
    def stream_lock(self) -> threading.Lock:
        """The engine's lock (a decode step, a submit, a weight load)."""
        if getattr(self, "_stream_lock", None) is None:
            self._stream_lock = threading.Lock()
            self._store_lock = threading.Lock()
            self._stream_done = threading.Condition(self._store_lock)
            self._stream_store, self._stream_error = StreamStore(), None
            # seconds decoding and refreshing weights, response tokens made: the
            # generate node's metrics in every mode (the driver takes differences)
            self._stream_time = {"gen_s": 0.0, "sync_s": 0.0, "tokens": 0}
            self._stream_thread, self._stream_stop = None, threading.Event()
            self._stream_busy, self._stream_counts = False, {}
            self._stream_spans: list[list[float]] = []
        return self._stream_lock

    @property
    def store_lock(self) -> threading.Lock:
        """The store's lock (after `stream_lock` when both are taken)."""
        self.stream_lock  # noqa: B018 - creates both
        return self._store_lock

    def _held_store(self) -> StreamStore:
        self.stream_lock  # noqa: B018 - creates the store
        return self._stream_store

    def _held_lock(self) -> threading.Lock:
        """A take or keep: the store's lock, not the engine's (never waits for a step)."""
        return self.store_lock

    def _stream_engine(self):
        engine = self.engine
        check_streaming(engine, self.rollout_cfg.backend)
        return engine

    def _stream_reports(self) -> bool:
        """Whether this rank reports (and keeps rows): the first rank of its engine's tp
        group (`engine.tp`, 1 for a one-rank engine)."""
        tp = max(1, int(self._stream_engine().tp))
        return int(self.ctx.rank) % tp == 0

    def stream_submit(self, batch: Batch, **options) -> dict:
        """Queue the prompts sent to this rank; {uid: requests queued} for them."""
        opts = sampling_options(self.rollout_cfg, **options)
        if not len(batch):
            return {}
        with self.stream_lock:
            engine = self._stream_engine()
            engine.submit(batch.repeat(opts.n, interleave=True), opts)
            with self.store_lock:
                self._stream_busy = bool(engine.stream_busy)
                if not self._stream_reports():
                    return {}
                return self._expect(batch, opts.n)

    def stream_start(self) -> bool:
        """Run the engine loop on a thread of its own until `stream_abort`."""
        lock = self.stream_lock
        if int(self._stream_engine().tp) > 1:
            return False  # a tp group steps inline, in the driver's order (see above)
        if self._stream_thread is None:
            self._stream_stop.clear()
            self._stream_thread = threading.Thread(target=self._stream_run, args=(lock,),
                                                   name="hybridflow-stream", daemon=True)
            self._stream_thread.start()
        return True

    def _stream_run(self, lock) -> None:
        try:
            while not self._stream_stop.is_set():
                with lock:
                    engine = self._stream_engine()
                    span = None
                    if engine.stream_busy:
                        began = time.time()
                        out = self._timed_poll(engine, 1)
                        span = (began, time.time())
                    else:
                        out = None
                    idle = not engine.stream_busy
                    with self._store_lock:
                        self._stream_store.add(out)
                        self._stream_busy = not idle
                        self._stream_counts = {**engine.stream_counts(), **self._stream_time}
                        if span is not None:
                            _add_span(self._stream_spans, span)
                        if self._stream_store.reported or idle:  # a waiting poll returns
                            self._stream_done.notify_all()
                if idle:
                    self._stream_stop.wait(0.002)
        except BaseException as err:  # noqa: BLE001 - re-raised by the next poll
            self._stream_error = err
            with self._store_lock:
                self._stream_done.notify_all()

    def stream_poll(self, wait_s: float = 0.0, want: int = 1) -> dict:
        """{"groups": {uid: GroupStats tuple} of the groups that became whole here,
        "busy": requests left, "rows": samples that finished, "counts": the engine's
        counters}. Background mode waits up to `wait_s` until `want` groups are whole
        (or the engine is idle): one reply for what the step needs, not one a group."""
        if self._stream_thread is None:
            return self._inline_poll()
        store = self._stream_store
        with self.store_lock:  # the loop's thread decodes meanwhile
            deadline = time.monotonic() + wait_s
            while len(store.reported) < max(1, want) and self._stream_error is None \
                    and self._stream_busy and time.monotonic() < deadline:
                self._stream_done.wait(timeout=deadline - time.monotonic())
            if self._stream_error is not None:
                raise RuntimeError("the streaming rollout loop failed") from self._stream_error
            groups = store.report()
            spans, self._stream_spans = self._stream_spans, []
            return self._reply(groups, sum(g[0] for g in groups.values()),
                               dict(self._stream_counts), self._stream_busy, spans)

    def _inline_poll(self) -> dict:
        """`rollout.stream_poll_steps` decode steps here and now (no loop thread)."""
        with self.stream_lock, self.store_lock:
            engine, store = self._stream_engine(), self._stream_store
            began = time.perf_counter()
            self._refresh(engine)
            self._stream_time["sync_s"] += time.perf_counter() - began
            before = _rows_in(store)
            store.add(self._timed_poll(engine, self.rollout_cfg.stream_poll_steps))
            groups = store.report()
            return self._reply(groups, _rows_in(store) - before,
                               {**engine.stream_counts(), **self._stream_time},
                               bool(engine.stream_busy))

    def _reply(self, groups: dict, rows: int, counts: dict, busy: bool,
               spans: list | None = None) -> dict:
        if not self._stream_reports():  # a replica of its group's first rank
            groups, counts, rows, spans = {}, {}, 0, None
        return poll_reply(groups, busy, rows, counts, spans)

    def _timed_poll(self, engine, steps: int):
        """`engine.poll(steps)`, its seconds and the response tokens it finished
        counted (under the stream lock)."""
        began = time.perf_counter()
        out = engine.poll(steps)
        self._stream_time["gen_s"] += time.perf_counter() - began
        if out is not None and "response_mask" in out:
            self._stream_time["tokens"] += int(out["response_mask"].sum())
        return out

    def _refresh(self, engine) -> None:
        """A colocated engine gets the actor's weights and version (inline mode)."""
        host = self._host()
        if host is not None:
            refresh_engine(engine, host.module, host.policy_version, host._bucket_bytes())

    def stream_abort(self) -> int:
        """Stop the loop's thread (if any), drop the unfinished requests and the rows
        not taken."""
        lock = self.stream_lock
        self._stream_stop.set()
        if self._stream_thread is not None:
            self._stream_thread.join(timeout=60)
            self._stream_thread = None
        with lock, self._store_lock:
            self._stream_store.clear()
            self._stream_busy, self._stream_spans = False, []
            return int(self._stream_engine().abort())


def _rows_in(store: StreamStore) -> int:
    """Finished rows the store holds (whole or partial groups)."""
    return store.rows()


def _add_span(spans: list, span: tuple) -> None:
    """A decode step's [start, end] into the spans since the last poll: merged with
    the last when they (nearly) touch, or when the reply would grow past MAX_SPANS."""
    start, end = span
    if spans and (start - spans[-1][1] <= SPAN_GAP_S or len(spans) >= MAX_SPANS):
        spans[-1][1] = end
    else:
        spans.append([start, end])
