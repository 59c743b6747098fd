"""The rollout role's streaming calls with the engine loop on its own thread
(workers/rollout/stream_worker.py), against an engine whose decode step waits on a
gate: a take (a pass's task) never waits for a decode step, a poll that finds no group
and no request left is right that none is coming, and a poll reports the loop's
decode spans — its work, not its waits."""
from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import pytest
import torch

from hybridflow.core.batch import Batch
from hybridflow.workers.config import RolloutConfig
from hybridflow.workers.rollout.stream_worker import StreamCalls


class GatedEngine:
    """Each request finishes after one decode step; a step waits for `gate` (set:
    steps run freely) and sleeps `step_s`."""
    tp = 1

    def __init__(self, step_s: float = 0.0):
        self.queue: list[Batch] = []
        self.gate, self.step_s, self.steps = threading.Event(), step_s, 0
        self.gate.set()
        self.in_step = threading.Event()

    @property
    def stream_busy(self) -> bool:
        return bool(self.queue)

    def submit(self, rows: Batch, opts) -> None:
        self.queue.append(rows)

    def poll(self, steps: int):
        self.in_step.set()
        self.gate.wait(10)
        time.sleep(self.step_s)
        self.in_step.clear()
        self.steps += 1
        rows = self.queue.pop(0)
        return Batch({"policy_version": torch.zeros(len(rows), dtype=torch.long),
                      "token_versions": torch.zeros(len(rows), 1, dtype=torch.long),
                      "response_mask": torch.ones(len(rows), 1)}, {"uid": rows["uid"]})

    def stream_counts(self) -> dict:
        return {"decode_steps": self.steps}

    def abort(self) -> int:
        self.queue.clear()
        return 0


class Worker(StreamCalls):
    def __init__(self, engine):
        self.engine = engine
        self.rollout_cfg = RolloutConfig(n=2)
        self.ctx = SimpleNamespace(rank=0)

    def _stream_engine(self):
        return self.engine

    def _host(self):
        return None


def prompts(*uids: str) -> Batch:
    return Batch({"input_ids": torch.zeros(len(uids), 1, dtype=torch.long)},
                 {"uid": list(uids)})


@pytest.fixture
def worker():
    w = Worker(GatedEngine())
    yield w
    w.engine.gate.set()
    w.stream_abort()


def _whole(worker, want: int, spans: list | None = None) -> dict:
    groups: dict = {}
    deadline = time.monotonic() + 10
    while len(groups) < want and time.monotonic() < deadline:
        reply = worker.stream_poll(1.0, want - len(groups))
        groups.update(reply["groups"])
        if spans is not None:
            spans += reply["spans"]
    return groups


def test_a_take_does_not_wait_for_a_decode_step(worker):
    worker.stream_submit(prompts("a", "b"))
    assert worker.stream_start()
    assert set(_whole(worker, 2)) == {"a", "b"}
    worker.engine.gate.clear()  # the next decode step holds the engine's lock
    worker.stream_submit(prompts("c"))
    assert worker.engine.in_step.wait(5)
    # the gate stays shut until after the take: a take that waited for the decode step
    # would not return at all (the join's bound only keeps a regression from hanging)
    taken: dict = {}
    taker = threading.Thread(target=lambda: taken.update(rows=worker.stream_take(["a"])),
                             daemon=True)
    taker.start()
    taker.join(60)
    assert not worker.engine.gate.is_set() and not taker.is_alive()
    rows = taken["rows"]
    assert list(rows["uid"]) == ["a", "a"]
    assert worker.stream_keep(None, [], ["b"]) == 0  # a keep neither
    worker.engine.gate.set()
    assert set(_whole(worker, 1)) == {"c"}


def test_a_poll_with_nothing_left_in_flight_says_so_and_has_every_group(worker):
    worker.stream_submit(prompts("a"))
    worker.stream_start()
    deadline = time.monotonic() + 10
    seen: dict = {}
    while time.monotonic() < deadline:
        reply = worker.stream_poll(0.2, 1)
        seen.update(reply["groups"])
        if not reply["busy"]:
            break
    assert not reply["busy"] and set(seen) == {"a"}
    assert reply["counts"]["decode_steps"] == 1


def test_a_poll_reports_the_loops_decode_spans_not_its_waits():
    """Two decode steps of 50 ms after 300 ms idle: the spans cover the steps (about
    0.1 s), not the idle time before them nor the waits between polls."""
    worker = Worker(GatedEngine(step_s=0.05))
    spans: list = []
    try:
        worker.stream_start()
        time.sleep(0.3)  # idle: nothing in flight, no span
        spans += worker.stream_poll(0.0, 1)["spans"]
        began = time.time()
        worker.stream_submit(prompts("a", "b"))
        worker.stream_submit(prompts("c"))
        assert set(_whole(worker, 3, spans)) == {"a", "b", "c"}
        ended = time.time()
        time.sleep(0.2)  # idle again
        spans += worker.stream_poll(0.0, 1)["spans"]
    finally:
        worker.stream_abort()
    assert spans and all(began - 1e-3 <= s <= e <= ended + 1e-3 for s, e in spans)
    assert 0.1 <= sum(e - s for s, e in spans) <= ended - began
