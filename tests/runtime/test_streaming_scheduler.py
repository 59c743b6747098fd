"""The streaming scheduler's bookkeeping (runtime/streaming.py) against a fake engine
whose requests finish in a seeded random order, several decode polls long: whole
groups only, the admission bound per sample (stale groups generated again, never
trained), at most k + 1 batches' worth of prompts drawn ahead, and checkpoint/resume
at every step losing and repeating no prompt. The real engine and runtimes are
tested in tests/e2e/test_streaming.py; this covers many more interleavings."""
from __future__ import annotations


import pytest

from hybridflow.runtime.run_long.run_scheduler import RunScheduler
from stream_fakes import STEPS, SIZE, FakeStream, Loader, plan_for

def run(k, seed, steps=range(1, STEPS + 1), state=None, slow=4, side="auto",
        background=False):
    """`background`: polled as a rollout with its engine on its own thread is (one
    more poll after each pass, whose groups the next pass screens beside training)."""
    engine = FakeStream(seed, version=steps[0] - 1, slow=slow)
    sched = RunScheduler(engine, plan_for(k, side), Loader(), background=background)
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


@pytest.mark.parametrize("background", [False, True])
@pytest.mark.parametrize("k", [1, 2])
@pytest.mark.parametrize("save", range(1, STEPS))
def test_resume_after_any_step_loses_and_repeats_no_prompt(k, save, background):
    whole, _, _, states = run(k, 7, background=background)
    state, at_save = states[save]
    resumed, sched, _, _ = run(k, 11, steps=range(save + 1, STEPS + 1), state=state,
                               background=background)
    before = [u for uids in whole.trained[:save] for u in uids]
    after = [u for uids in resumed.trained for u in uids]
    trained = before + after
    assert len(trained) == len(set(trained)) == STEPS * SIZE
    assert at_save <= set(after) | set(sched.source.prompts)  # re-drawn, once
    drawn = {f"u{i}" for i in range(sched.loader.served)}
    assert set(trained) | set(sched.source.prompts) == drawn  # nothing drawn is lost


@pytest.mark.parametrize("k", [1, 2])
def test_stream_side_nodes_run_at_the_entrance_and_each_buffer_takes_its_rows(k):
    """No filter: every whole group runs through GRPO's stream-side nodes (an entrance
    pass), each kept; each training pass's buffers take the samples and each
    handed-over node's rows, row-aligned (FakeStream.run_step checks the tags), and a
    group leaves the worker's store with its last producer's rows."""
    engine, sched, results, _ = run(k, 3, slow=6)
    assert sched.source.entrance is not None and sched.source.filtered == 0
    assert engine.handed == [["grpo_advantages", "ref.logprob"]] * STEPS
    flat = [u for uids in engine.trained for u in uids]
    assert len(flat) == len(set(flat)) == STEPS * SIZE
    assert all(r.metrics["reward/score/mean"] > 0 for r in results.values())
    held = set(engine.store.whole)
    assert held <= set(sched.source.prompts)  # only groups drawn and not trained
    assert all(set(g) == {None, "grpo_advantages", "ref.logprob"}
               for g in engine.store.whole.values())


def test_generate_only_keeps_them_on_the_train_side():
    engine, sched, _, _ = run(1, 3, side="generate_only")
    assert sched.source.entrance is None
    assert engine.handed == [[]] * STEPS
    assert len({u for uids in engine.trained for u in uids}) == STEPS * SIZE


@pytest.mark.parametrize("k", [2, 3])
@pytest.mark.parametrize("seed", range(3))
def test_the_entrance_runs_inside_the_training_pass_on_groups_already_whole(k, seed):
    """With the engine on its own thread (here: a fast engine, its requests done by
    the next poll), the groups a pass's closing poll found whole run through the
    stream-side nodes inside the next training pass (beside the update), not in a
    pass of their own; each is trained in a later step, once, with its own
    handed-over rows (FakeStream checks the tags) and within the bound; a step
    reports the reward of the groups it trains, and no `entrance/` node. (At k = 1
    the one batch ahead is drawn as its step begins: whole only after that step's
    pass, so it is screened in a pass of its own.)"""
    engine, sched, results, _ = run(k, seed, slow=1, background=True)
    assert len(engine.joint) >= STEPS // 2, engine.joint
    trained = [u for uids in engine.trained for u in uids]
    assert len(trained) == len(set(trained)) == STEPS * SIZE
    for at, screened in engine.joint:  # trained by a later pass than screened them
        assert all(trained.index(u) >= at * SIZE for u in screened)
    assert engine.handed == [["grpo_advantages", "ref.logprob"]] * STEPS
    for result in results.values():
        assert result.metrics["async/staleness/max"] <= k
        assert result.metrics["reward/score/mean"] > 0
        assert not any(n.startswith("entrance/") for n in result.node_metrics)
