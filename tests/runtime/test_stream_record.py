"""The stream side's timeline records of a streaming run (runtime/run_long/stream_record.py), and
the streaming scheduler writing them into each step's timeline (runtime/streaming.py)."""
from __future__ import annotations

import pytest

from hybridflow.runtime.run_long import stream_record
from hybridflow.runtime.run_long.stream_record import StreamRecorder


class Clock:
    def __init__(self, t: float = 100.0):
        self.t = t

    def time(self) -> float:
        return self.t


@pytest.fixture
def clock(monkeypatch):
    fake = Clock()
    monkeypatch.setattr(stream_record.time, "time", fake.time)
    return fake


def reply(steps: int, rows: int = 0, busy: bool = True) -> dict:
    return {"rows": rows, "groups": {}, "busy": busy,
            "counts": {"decode_steps": steps}}


def test_background_polls_merge_into_one_record_per_rank_with_their_counts(clock):
    rec = StreamRecorder("rollout.generate", "rollout", "gen", background=True)
    rec.begin_step()  # t = 100
    for t, steps in ((100.5, 3), (101.0, 7), (101.5, 9)):
        clock.t = t
        rec.polled(t - 0.001, [reply(steps, rows=1), reply(steps * 2)])
    assert [(r["rank"], r["start"], r["end"], r["decode_steps"], r["rows"])
            for r in rec.records] == [(0, 100.0, 101.5, 9, 3), (1, 100.0, 101.5, 18, 0)]
    assert {r["stream"] for r in rec.records} == {"poll"}
    assert {r["pool"] for r in rec.records} == {"gen"}


def test_a_steps_records_start_with_the_step_and_an_idle_interval_breaks_them(clock):
    rec = StreamRecorder("g", "rollout", "gen", background=True)
    rec.begin_step()
    clock.t = 101.0
    rec.polled(100.99, [reply(5)])
    clock.t = 103.0  # the time between two steps: not on record
    rec.begin_step()
    clock.t = 103.5
    rec.polled(103.49, [reply(5, busy=False)])  # idle, no progress: nothing
    clock.t = 104.0
    rec.polled(103.99, [reply(8, rows=2)])
    assert [(r["start"], r["end"], r["decode_steps"], r["rows"]) for r in rec.records] == \
        [(103.5, 104.0, 3, 2)]


def test_background_replies_with_spans_record_the_work_not_the_waits(clock):
    """A reply's decode spans (the loop's work, timed on the worker) are the records:
    clipped to the step, a gap between spans left out, the counts on the last; a
    reply with no span (the engine waited) records nothing, even while busy; steps
    decoded before the step are counted on a record of no length."""
    rec = StreamRecorder("g", "rollout", "gen", background=True)
    rec.begin_step()  # t = 100
    clock.t = 101.0
    rec.polled(100.9, [{**reply(6, rows=2), "spans": [[99.5, 100.2], [100.6, 100.8]]}])
    clock.t = 101.5
    rec.polled(101.4, [{**reply(6), "spans": []}])
    clock.t = 102.0
    rec.polled(101.9, [{**reply(7, rows=1), "spans": [[100.8, 101.9]]}])
    assert [(r["start"], r["end"], r["decode_steps"], r["rows"]) for r in rec.records] == \
        [(100.0, 100.2, 0, 0), (100.6, 101.9, 7, 3)]
    rec.begin_step()  # t = 102: the loop decoded before the step only
    clock.t = 102.5
    rec.polled(102.4, [{**reply(9, rows=2), "spans": [[101.95, 101.99]]}])
    assert [(r["start"], r["end"], r["decode_steps"], r["rows"]) for r in rec.records] == \
        [(102.0, 102.0, 2, 2)]  # counted, with no time on record


def test_an_inline_poll_is_the_decode_span_of_the_call(clock):
    rec = StreamRecorder("g", "rollout", "main", background=False)
    rec.begin_step()
    clock.t = 100.2
    rec.polled(100.1, [reply(4)])
    clock.t = 100.5
    rec.polled(100.4, [reply(8, rows=3)])
    assert [(r["start"], r["end"], r["decode_steps"], r["stream"]) for r in rec.records] == \
        [(100.1, 100.2, 4, "decode"), (100.4, 100.5, 4, "decode")]


def test_the_streaming_scheduler_puts_the_stream_side_in_each_steps_timeline():
    """Background mode (the engine on its own thread): the polls of the wait and the
    one after the pass are on record, with every decode step the engine counted."""
    from stream_fakes import STEPS, FakeStream, Loader, plan_for

    from hybridflow.runtime.run_long.run_scheduler import RunScheduler

    class Threaded(FakeStream):
        polls = 0

        def call(self, method, *args, **kwargs):
            if method == "stream_start":
                return True
            out = super().call(method, *args, **kwargs)
            if method == "stream_poll":
                self.polls += 1
                out["counts"] = {"decode_steps": self.polls}
            return out

    engine = Threaded(3)
    sched = RunScheduler(engine, plan_for(1), Loader(), background=True)
    timelines = [sched.step(step, STEPS).timeline for step in range(1, STEPS + 1)]
    stream = [r for t in timelines for r in t if r.get("stream")]
    assert stream and all(r["node"] == "rollout.generate" and r["rank"] == 0 for r in stream)
    assert sum(r["decode_steps"] for r in stream) == engine.polls
    assert all(len([r for r in t if r.get("stream")]) >= 1 for t in timelines)
