"""The streaming scheduler's bookkeeping (runtime/streaming.py) against a fake engine
whose requests finish in a seeded random order, several decode polls long: whole
groups only, the admission bound per sample (stale groups generated again, never
trained), at most k + 1 batches' worth of prompts drawn ahead, and checkpoint/resume
at every step losing and repeating no prompt. The real engine and runtimes are
tested in tests/e2e/test_streaming.py; this covers many more interleavings."""
from __future__ import annotations


import pytest

from hybridflow.runtime.run_scheduler import RunScheduler
from stream_fakes import STEPS, SIZE, FakeStream, Loader, plan_for

def run(k, seed, steps=range(1, STEPS + 1), state=None, slow=4):
    engine = FakeStream(seed, version=steps[0] - 1, slow=slow)
    sched = RunScheduler(engine, plan_for(k), Loader(), background=False)
    if state is not None:
        sched.load_state_dict(state, steps[0] - 1)
    results, states = {}, {}
    for step in steps:
        results[step] = sched.step(step, STEPS)
        states[step] = (sched.state_dict(), set(sched.source.prompts))
    return engine, sched, results, states


@pytest.mark.parametrize("k", [1, 2])
@pytest.mark.parametrize("seed", range(4))
def test_whole_admitted_groups_and_a_bounded_lead(k, seed):
    engine, sched, results, _ = run(k, seed, slow=6)
    for step, uids in enumerate(engine.trained, start=1):
        assert len(uids) == SIZE
        assert results[step].metrics["async/staleness/max"] <= k
    flat = [u for uids in engine.trained for u in uids]
    assert len(flat) == len(set(flat)) == STEPS * SIZE
    assert sched.loader.served <= (STEPS + k) * SIZE + SIZE * sched.source.requeued


def test_stale_groups_are_generated_again_not_trained():
    engine, sched, results, _ = run(1, 0, slow=12)
    assert sched.source.requeued > 0
    assert max(r.metrics["async/staleness/max"] for r in results.values()) <= 1


@pytest.mark.parametrize("k", [1, 2])
@pytest.mark.parametrize("save", range(1, STEPS))
def test_resume_after_any_step_loses_and_repeats_no_prompt(k, save):
    whole, _, _, states = run(k, 7)
    state, at_save = states[save]
    resumed, sched, _, _ = run(k, 11, steps=range(save + 1, STEPS + 1), state=state)
    before = [u for uids in whole.trained[:save] for u in uids]
    after = [u for uids in resumed.trained for u in uids]
    trained = before + after
    assert len(trained) == len(set(trained)) == STEPS * SIZE
    assert at_save <= set(after) | set(sched.source.prompts)  # re-drawn, once
    drawn = {f"u{i}" for i in range(sched.loader.served)}
    assert set(trained) | set(sched.source.prompts) == drawn  # nothing drawn is lost
