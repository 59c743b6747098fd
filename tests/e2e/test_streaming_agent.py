"""Agent episodes streaming (`graphs/agent_grpo.py`, `trainer.async_mode=streaming`) on
the local runtime: episodes stream whole (hybridflow/agents/stream.py), each played by
one weights version, so every response token carries its row's version; groups are
admitted whole by that version (a poll plays 3 groups, a step takes 4, so played
groups wait a step and train one update old); a resumed run trains each prompt once."""
from __future__ import annotations

import pytest

from tests.support.stream_runs import check_rows, stream_recording, trained_uids

# a poll plays 12 episodes (3 groups of n = 4): some wait for the next step
ARGS = ("trainer.staleness=1", "actor.off_policy=decoupled", "rollout.micro_batch_size=12")


def test_agent_episodes_stream_whole_with_one_version_each(tmp_path):
    trainer, seen = stream_recording(tmp_path, "trainer.steps=4", *ARGS, graph="agent_grpo")
    check_rows(seen, 1)
    for rows, _, _ in seen.values():
        real = rows["response_mask"].bool()
        for version, tokens, mask in zip(rows["policy_version"].tolist(),
                                         rows["token_versions"], real):
            assert (tokens[mask] == version).all()  # one version per episode
    metrics = [m for _, m, _ in seen.values()]
    assert max(m["async/staleness/max"] for m in metrics) == 1  # some waited a step
    assert all(m["async/mixed_version_rows"] == 0 for m in metrics)
    uids = trained_uids(seen)
    assert len(uids) == len(set(uids)) == 4 * 4
    assert metrics[-1]["async/stream/episodes"] >= 4 * 4 * 4
    assert all("actor/pg_loss" in m for m in metrics)


@pytest.mark.slow  # three runs
def test_agent_streaming_resume_trains_each_prompt_once(tmp_path):
    args = ("trainer.steps=5", "trainer.save_every=2", *ARGS)
    _, whole = stream_recording(tmp_path / "whole", *args, graph="agent_grpo")
    part_trainer, part = stream_recording(tmp_path / "part", *args, graph="agent_grpo",
                                          stop_after=3)
    assert part_trainer.saved_step == 2
    before = trained_uids({s: part[s] for s in (1, 2)})
    assert before == trained_uids({s: whole[s] for s in (1, 2)})
    resumed_trainer, resumed = stream_recording(tmp_path / "part", *args,
                                                graph="agent_grpo",
                                                resume=part_trainer.run.path)
    assert sorted(resumed) == [3, 4, 5]
    trained = before + trained_uids(resumed)
    assert len(trained) == len(set(trained)) == 5 * 4
    at_save = part[2][2]  # drawn and untrained at the save: drawn again
    assert at_save and at_save <= set(trained) | set(resumed_trainer.scheduler.prompts)
