"""DAPO streaming (`graphs/dapo.py`, `trainer.async_mode=streaming`) on the local
runtime: its dynamic sampling filters at the buffer's entrance. Every trained group
passed the filter (its scores are not all equal) and is whole and admitted; the
groups the filter dropped are counted and never trained; a resumed run trains each
kept prompt once and never draws a dropped one again.

`algorithm.overlong_buffer=0` turns the soft overlong penalty off, so the toy's scores
are 0 or 1 and groups that score all the same (the ones DAPO drops) are common."""
from __future__ import annotations

import pytest

from tests.support.stream_runs import KEYS, check_rows, stream_recording, trained_uids

ARGS = ("trainer.staleness=1", "actor.off_policy=decoupled", "algorithm.overlong_buffer=0")
N = 4  # rollout.n in tests/support/stream_runs.py


def _drawn(trainer) -> set[str]:
    return {f"u{i}" for i in range(trainer.train_loader.served)}


def _dropped(trainer, steps) -> set[str]:
    return {u for s in steps for u in trainer.filtered[s]}


def test_dapo_streams_with_its_filter_at_the_buffer_entrance(tmp_path):
    trainer, seen = stream_recording(tmp_path, "trainer.steps=4", *ARGS, graph="dapo",
                                     keys=(*KEYS, "scores"))
    check_rows(seen, 1, n=N)
    for rows, _, _ in seen.values():
        by_uid = {}
        for uid, score in zip(rows["uid"], rows["scores"].tolist()):
            by_uid.setdefault(uid, set()).add(score)
        assert len(by_uid) == 4 and all(len(s) > 1 for s in by_uid.values())  # all passed
    uids = trained_uids(seen)
    dropped = _dropped(trainer, seen)
    assert len(uids) == len(set(uids)) == 4 * 4
    assert dropped and not dropped & set(uids)  # some were dropped, none trained
    last = seen[4][1]
    assert last["async/filtered_groups"] == len(dropped)
    assert sum(m["dapo/dropped_groups_total"] for _, m, _ in seen.values()) == len(dropped)
    left = set(trainer.scheduler.prompts)
    assert set(uids) | dropped | left == _drawn(trainer)  # drawn more in their place


@pytest.mark.slow  # three runs
def test_dapo_resume_trains_each_kept_prompt_once_and_never_redraws_a_dropped_one(tmp_path):
    args = ("trainer.steps=5", "trainer.save_every=2", *ARGS)
    whole_trainer, whole = stream_recording(tmp_path / "whole", *args, graph="dapo")
    part_trainer, part = stream_recording(tmp_path / "part", *args, graph="dapo",
                                          stop_after=3)
    assert part_trainer.saved_step == 2
    before = trained_uids({s: part[s] for s in (1, 2)})
    assert before == trained_uids({s: whole[s] for s in (1, 2)})
    dropped_before = _dropped(part_trainer, (1, 2))
    assert dropped_before == _dropped(whole_trainer, (1, 2))
    resumed_trainer, resumed = stream_recording(tmp_path / "part", *args, graph="dapo",
                                                resume=part_trainer.run.path)
    assert sorted(resumed) == [3, 4, 5]
    after = trained_uids(resumed)
    trained = before + after
    assert len(trained) == len(set(trained)) == 5 * 4  # each kept prompt once
    dropped_after = _dropped(resumed_trainer, resumed)
    left = set(resumed_trainer.scheduler.prompts)
    # a prompt dropped before the save stays consumed: never drawn again
    assert not dropped_before & (set(after) | dropped_after | left)
    dropped = dropped_before | dropped_after
    assert dropped and not dropped & set(trained)
    assert set(trained) | dropped | left == _drawn(resumed_trainer)  # none lost
