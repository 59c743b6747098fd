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
from tests.support.stream_runs import check_rows, stream_recording, trained_uids


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
