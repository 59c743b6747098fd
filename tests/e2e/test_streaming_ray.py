"""Streaming rollout on Ray, with the rollout on a pool of its own: the engine loop runs
on the rollout worker's own thread while the actor's pool trains.

What the test checks, and what it cannot: which samples finish before which update
depends on timing on Ray, so the set of (uid, policy_version) pairs is not fixed and
is not compared with the local runtime's. What holds for any timing is checked: every
trained (uid, policy_version) pair is admitted (trained - k <= version <= trained),
each group is trained once and whole, each token's version is non-decreasing along
its response with the row's version its oldest token's, the weights reached the
rollout's own copy (weight sync bytes) and the loop ran in the background."""
from __future__ import annotations

import json

import pytest

from tests.support.async_runs import SPLIT
from tests.support.stream_runs import KEYS, check_rows, stream_recording, trained_uids


@pytest.mark.slow  # a Ray run
@pytest.mark.ray
@pytest.mark.usefixtures("ray_session")
def test_ray_streams_admitted_versions_with_the_rollout_on_its_own_pool(tmp_path):
    trainer, seen = stream_recording(tmp_path, "trainer.steps=4", "trainer.staleness=1",
                                     "runtime.name=ray", "runtime.torch_threads=1",
                                     "actor.off_policy=decoupled", *SPLIT)
    assert trainer.scheduler.background
    check_rows(seen, 1)
    uids = trained_uids(seen)
    assert len(uids) == len(set(uids)) == 4 * 4
    pairs = {(u, v) for rows, _, _ in seen.values()
             for u, v in zip(rows["uid"], rows["policy_version"].tolist())}
    assert {u for u, _ in pairs} == set(uids)
    last = seen[4][1]
    assert last["engine/weight_sync_bytes"] > 0 and last["async/stream/decode_steps"] > 0
    # the stream side is on record (runtime/stream_record.py): the engine's work between
    # polls on the rollout's pool, every decode step it counted, for the timeline
    (timeline,) = tmp_path.glob("*/timeline.jsonl")
    records = [json.loads(line) for line in timeline.read_text().splitlines()]
    stream = [r for r in records if r.get("stream")]
    assert {(r["stream"], r["pool"], r["node"]) for r in stream} == {
        ("poll", "gen", "rollout.generate")}
    assert sum(r["decode_steps"] for r in stream) == last["async/stream/decode_steps"]
    assert all("origin" in r for r in records)


@pytest.mark.slow  # a Ray run
@pytest.mark.ray
@pytest.mark.usefixtures("ray_session")
def test_ray_streams_dapo_with_its_filter_at_the_buffer_entrance(tmp_path):
    """The entrance pass (reward, penalty, filter) runs on the workers between polls:
    every trained group passed it, whole and admitted; what it dropped is not trained.
    (How many it drops depends on timing here, so only the accounting is checked.)"""
    trainer, seen = stream_recording(tmp_path, "trainer.steps=3", "trainer.staleness=1",
                                     "runtime.name=ray", "runtime.torch_threads=1",
                                     "actor.off_policy=decoupled", "algorithm.overlong_buffer=0",
                                     *SPLIT, graph="dapo", keys=(*KEYS, "scores"))
    check_rows(seen, 1)
    for rows, _, _ in seen.values():
        by_uid = {}
        for uid, score in zip(rows["uid"], rows["scores"].tolist()):
            by_uid.setdefault(uid, set()).add(score)
        assert len(by_uid) == 4 and all(len(s) > 1 for s in by_uid.values())
    uids = trained_uids(seen)
    dropped = {u for s in seen for u in trainer.filtered[s]}
    assert len(uids) == len(set(uids)) == 3 * 4 and not dropped & set(uids)
    assert seen[3][1]["async/filtered_groups"] == len(dropped)
    # the entrance pass ran on Ray (in the steps whose polls completed a group: which
    # ones depends on timing, so not necessarily the last)
    assert any(m.get("timing_s/reward.score", 0) > 0 for _, m, _ in seen.values())


@pytest.mark.slow  # a Ray run
@pytest.mark.ray
@pytest.mark.usefixtures("ray_session")
def test_ray_streams_agent_episodes_inline_in_the_actors_process(tmp_path):
    """The agent role lives in the actor's worker process, so its episodes stream by
    inline polls (no thread of its own), each episode played by one version."""
    trainer, seen = stream_recording(tmp_path, "trainer.steps=3", "trainer.staleness=1",
                                     "runtime.name=ray", "runtime.torch_threads=1",
                                     "actor.off_policy=decoupled",
                                     "rollout.micro_batch_size=12", graph="agent_grpo")
    assert not trainer.scheduler.background
    check_rows(seen, 1)
    uids = trained_uids(seen)
    assert len(uids) == len(set(uids)) == 3 * 4
    assert seen[3][1]["async/stream/episodes"] >= 3 * 4 * 4
