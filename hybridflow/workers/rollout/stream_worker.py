"""The rollout role's streaming calls (`trainer.async_mode=streaming`), called by the
run's streaming scheduler through `runtime.call_role` (not graph methods: no plan node
runs them).

- `stream_submit(batch, **options)`: this rank's share of the prompts (prompt i goes
  to rank i mod world size, so a prompt's n samples stay on one rank), repeated n
  times, queued in the engine (`StreamingEngine.submit`). An engine over a tp group
  of ranks (`engine.tp` > 1): prompt i goes to group i mod (world / tp), every rank of
  the group queues it, and only the group's first rank reports (submit counts, rows).
- `stream_poll()`: inline mode (the local runtime, or a rollout sharing the actor's
  process) runs `rollout.stream_poll_steps` decode steps and returns what finished;
  background mode (`stream_start()`, Ray with the rollout on its own pool) returns
  what the engine loop, running on its own thread, finished since the last poll.
- `stream_abort()`: drop what is not finished (the end of a run).

A tp group steps inline only (`stream_start` starts no thread for it): its ranks must
run vLLM's collectives in one order, which calls from the driver give (each rank gets
them in the order sent) and a thread per rank, racing the weight loads, would not.

Weights: a colocated engine is refreshed to the actor's weights and version before
each inline poll (for the `hf` engine that shares the module, the version only); a
rollout with its own weights receives them through `rollout.load_weights` (the plan's
weight sync), which takes `stream_lock`, so a load lands between two decode steps of
the background loop, never inside one.

State (per worker): `_stream_lock`, the background thread and its stop flag, the
finished batches it collected, the error it died of (re-raised by the next poll).
"""
from __future__ import annotations

import threading

from hybridflow.core.batch import Batch
from hybridflow.workers.rollout.engine import check_streaming
from hybridflow.workers.rollout.generation import sampling_options
from hybridflow.workers.rollout.weights import refresh_engine

__all__ = ["StreamCalls"]


class StreamCalls:
    """Mixed into RolloutWorker: needs `engine`, `rollout_cfg`, `ctx`, `_host()`."""

    @property
    def stream_lock(self) -> threading.Lock:
        if getattr(self, "_stream_lock", None) is None:
            self._stream_lock = threading.Lock()
            self._stream_out, self._stream_error = [], None
            self._stream_thread, self._stream_stop = None, threading.Event()
        return self._stream_lock

    def _stream_engine(self):
        engine = self.engine
        check_streaming(engine, self.rollout_cfg.backend)
        return engine

    def _stream_group(self) -> tuple[int, int, bool]:
        """(prompt shares, this rank's share, whether this rank reports): one share per
        engine, i.e. per tp group of ranks (`engine.tp`, 1 for a one-rank engine)."""
        tp = max(1, int(getattr(self._stream_engine(), "tp", 1)))
        world, rank = max(1, int(self.ctx.world_size)), int(self.ctx.rank)
        return max(1, world // tp), rank // tp, rank % tp == 0

    def stream_submit(self, batch: Batch, **options) -> dict:
        """Queue this rank's prompts; returns {uid: requests queued} for them."""
        opts = sampling_options(self.rollout_cfg, **options)
        shares, share, reports = self._stream_group()
        mine = batch.take([i for i in range(len(batch)) if i % shares == share])
        if not len(mine):
            return {}
        with self.stream_lock:
            self._stream_engine().submit(mine.repeat(opts.n, interleave=True), opts)
        return {str(uid): opts.n for uid in mine["uid"]} if reports else {}

    def stream_start(self) -> bool:
        """Run the engine loop on a thread of its own until `stream_abort`."""
        lock = self.stream_lock
        if self._stream_group()[0] < max(1, int(self.ctx.world_size)):
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
                    out = engine.poll(1) if engine.stream_busy else None
                    if out is not None:
                        self._stream_out.append(out)
                    idle = not engine.stream_busy
                if idle:
                    self._stream_stop.wait(0.002)
        except BaseException as err:  # noqa: BLE001 - re-raised by the next poll
            self._stream_error = err

    def stream_poll(self) -> dict:
        """{"rows": finished rows or None, "busy": requests left, "counts": the engine's
        counters}."""
        with self.stream_lock:
            if self._stream_error is not None:
                raise RuntimeError("the streaming rollout loop failed") from self._stream_error
            engine = self._stream_engine()
            if self._stream_thread is None:
                self._refresh(engine)
                out = engine.poll(self.rollout_cfg.stream_poll_steps)
                batches = [out] if out is not None else []
            else:
                batches, self._stream_out = self._stream_out, []
            counts = engine.stream_counts() if hasattr(engine, "stream_counts") else {}
            rows = Batch.concat(batches) if batches else None
            if not self._stream_group()[2]:  # a replica of its group's first rank
                rows, counts = None, {}
            return {"rows": rows, "busy": bool(engine.stream_busy), "counts": counts}

    def _refresh(self, engine) -> None:
        """A colocated engine gets the actor's weights and version (inline mode)."""
        host = self._host()
        if host is not None:
            refresh_engine(engine, host.module, host.policy_version, host._bucket_bytes())

    def stream_abort(self) -> int:
        """Stop the loop's thread (if any) and drop the unfinished requests."""
        lock = self.stream_lock
        self._stream_stop.set()
        if self._stream_thread is not None:
            self._stream_thread.join(timeout=60)
            self._stream_thread = None
        with lock:
            self._stream_out = []
            return int(self._stream_engine().abort())
