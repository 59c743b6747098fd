"""Agent episodes streaming (`graphs/agent_grpo.py`, `trainer.async_mode=streaming`) on
the local runtime, resumed: a resumed run trains each prompt once, and the prompts
drawn and untrained at the save are drawn again. (Agent episodes streaming whole, one
version each, on both runtimes: test_streaming.py.)"""
from __future__ import annotations

import pytest

from tests.support.async_runs import STREAM, run_recording, trained_uids

# a poll plays 12 episodes (3 groups of n = 4): some wait for the next step
ARGS = ("trainer.staleness=1", "actor.off_policy=decoupled", "rollout.micro_batch_size=12")


@pytest.mark.slow  # three runs
def test_agent_streaming_resume_trains_each_prompt_once(tmp_path):
    args = ("trainer.steps=5", "trainer.save_every=2", *ARGS)
    _, whole = run_recording(tmp_path / "whole", *STREAM, *args, graph="agent_grpo")
    part_trainer, part = run_recording(tmp_path / "part", *STREAM, *args, graph="agent_grpo",
                                       stop_after=3)
    assert part_trainer.saved_step == 2
    before = trained_uids({s: part[s] for s in (1, 2)})
    assert before == trained_uids({s: whole[s] for s in (1, 2)})
    resumed_trainer, resumed = run_recording(tmp_path / "part", *STREAM, *args,
                                             graph="agent_grpo", resume=part_trainer.run.path)
    assert sorted(resumed) == [3, 4, 5]
    trained = before + trained_uids(resumed)
    assert len(trained) == len(set(trained)) == 5 * 4
    at_save = part[2].pending  # drawn and untrained at the save: drawn again
    assert at_save and at_save <= set(trained) | set(resumed_trainer.scheduler.source.prompts)
