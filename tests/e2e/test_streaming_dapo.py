"""DAPO streaming (`graphs/dapo.py`, `trainer.async_mode=streaming`) on the local
runtime, resumed: its dynamic sampling filters at the buffer's entrance, and a resumed
run trains each kept prompt once and never draws a dropped one again. (DAPO streaming
on both runtimes: test_streaming.py.)

`algorithm.overlong_buffer=0` turns the soft overlong penalty off, so the toy's scores
are 0 or 1 and groups that score all the same (the ones DAPO drops) are common."""
from __future__ import annotations

import pytest

from tests.support.async_runs import STREAM, run_recording, trained_uids

ARGS = ("trainer.staleness=1", "actor.off_policy=decoupled", "algorithm.overlong_buffer=0")


def _drawn(trainer) -> set[str]:
    return {f"u{i}" for i in range(trainer.train_loader.served)}


def _dropped(trainer, steps) -> set[str]:
    return {u for s in steps for u in trainer.filtered[s]}


@pytest.mark.slow  # three runs
def test_dapo_resume_trains_each_kept_prompt_once_and_never_redraws_a_dropped_one(tmp_path):
    args = ("trainer.steps=5", "trainer.save_every=2", *ARGS)
    whole_trainer, whole = run_recording(tmp_path / "whole", *STREAM, *args, graph="dapo")
    part_trainer, part = run_recording(tmp_path / "part", *STREAM, *args, graph="dapo",
                                       stop_after=3)
    assert part_trainer.saved_step == 2
    before = trained_uids({s: part[s] for s in (1, 2)})
    assert before == trained_uids({s: whole[s] for s in (1, 2)})
    dropped_before = _dropped(part_trainer, (1, 2))
    assert dropped_before == _dropped(whole_trainer, (1, 2))
    resumed_trainer, resumed = run_recording(tmp_path / "part", *STREAM, *args, graph="dapo",
                                             resume=part_trainer.run.path)
    assert sorted(resumed) == [3, 4, 5]
    after = trained_uids(resumed)
    trained = before + after
    assert len(trained) == len(set(trained)) == 5 * 4  # each kept prompt once
    dropped_after = _dropped(resumed_trainer, resumed)
    left = set(resumed_trainer.scheduler.source.prompts)
    # a prompt dropped before the save stays consumed: never drawn again
    assert not dropped_before & (set(after) | dropped_after | left)
    dropped = dropped_before | dropped_after
    assert dropped and not dropped & set(trained)
    assert set(trained) | dropped | left == _drawn(resumed_trainer)  # none lost
