"""Streaming rollout (`trainer.async_mode=streaming`), on both runtimes (`runtime_name`):
every row the update reads is admitted by its own version (per sample: the version of
its oldest token >= trained - k), carries one version per token and comes in whole
groups, each trained once, for GRPO (on Ray with the rollout on a pool of its own: the
engine loop runs on the rollout worker's own thread while the actor's pool trains, and
the weights reach the rollout's copy), DAPO (its filter at the buffer's entrance: every
trained group passed it, what it dropped is never trained) and agent episodes (whole,
one weights version each, played inline in the actor's process).

On the local runtime the schedule is fixed for a seed, so more is checked there:
partial rollouts mix versions inside a response while `rollout.partial=false` restarts
the sequences in flight; two runs train the same rows; a resumed run neither loses nor
repeats a prompt; GRPO learns the toy task streaming. On Ray which samples finish
before which update depends on timing, so only what holds for any timing is checked.
(DAPO's and the agent's resume: test_streaming_dapo.py, test_streaming_agent.py; a
killed Ray worker: test_streaming_kill_ray.py.)"""
from __future__ import annotations

import json

import pytest
import torch

from tests.support.async_runs import (SPLIT, STREAM, STREAM_KEYS, check_rows, run_recording,
                                      trained_uids)
from hybridflow.plan.async_split import sides_of
from tests.support.e2e import series, train

CORRECTED = ("actor.off_policy=decoupled",)
RAY = ("runtime.name=ray", "runtime.torch_threads=1")
SYNC_GENERATE_METRICS = {"rollout/weight_sync_s", "rollout/gen_s", "rollout/tokens_per_s",
                         "response_length/mean", "rollout/sampled_version"}
ON_RAY = [pytest.mark.ray, pytest.mark.slow]  # what the `runtime_name` fixture marks it
# Per runtime: the steps of a run and its overrides (GRPO's rollout on Ray: its own pool)
# (on Ray the rule reward is placed with the rollout, so it and the advantages run on
# the stream side, in entrance passes on the rollout's pool)
GRPO = {"local": (5, ()), "ray": (4, (*RAY, *SPLIT, "placement.roles.reward=gen"))}
DAPO = {"local": (4, ()), "ray": (3, (*RAY, *SPLIT))}
AGENT = {"local": (4, ()), "ray": (3, RAY)}


@pytest.mark.parametrize("runtime_name,k,partial", [
    ("local", 1, True), ("local", 1, False),
    pytest.param("local", 2, True, marks=pytest.mark.slow),
    pytest.param("local", 2, False, marks=pytest.mark.slow),
    pytest.param("ray", 1, True, marks=ON_RAY),
    pytest.param("ray", 2, True, marks=ON_RAY)], indirect=["runtime_name"])
def test_each_sample_and_token_carries_an_admitted_version(tmp_path, runtime_name, k, partial):
    steps, placed = GRPO[runtime_name]
    steps += k - 1  # k = 2 fills its lead in a step more
    trainer, seen = run_recording(tmp_path, *STREAM, f"trainer.steps={steps}",
                                  f"trainer.staleness={k}",
                                  f"rollout.partial={str(partial).lower()}", *CORRECTED,
                                  *placed)
    check_rows(seen, k)
    uids = trained_uids(seen)
    assert len(uids) == len(set(uids)) == steps * 4  # 4 whole groups a step, each once
    metrics = [m for _, m, _ in seen.values()]
    # the generate node reports what it reports synchronously (seconds, tokens a second)
    assert all(SYNC_GENERATE_METRICS <= set(m) for m in metrics)
    assert sum(m["rollout/gen_s"] for m in metrics) > 0  # (a step may find its groups done)
    assert sum(m["rollout/tokens_per_s"] for m in metrics) > 0
    if runtime_name == "ray":
        _check_the_background_loop(trainer, seen, tmp_path, k)
        return
    assert max(m["async/staleness/max"] for m in metrics) >= 1  # it did run ahead
    _check_the_stream_side_nodes(trainer, seen, metrics)
    mixed = sum(m["async/mixed_version_rows"] for m in metrics)
    if partial:
        assert mixed > 0  # some responses continued across a weight update
    else:
        assert mixed == 0 and metrics[-1]["async/stream/restarts"] > 0


def _check_the_stream_side_nodes(trainer, seen, metrics) -> None:
    """GRPO's reward, reference and advantages ran on the stream side (the default
    trainer.stream_side=auto), in entrance passes: each step reports its batch's
    reward, and the update read each handed-over node through a buffer of its own,
    its rows aligned with the samples (the last step: each group's advantages are its
    own, centred on the group: they sum to 0 per uid)."""
    plan = trainer.scheduler.source.plan
    assert {"reward.score", "grpo_advantages", "ref.logprob"} <= \
        set(sides_of(plan).rollout)
    assert {"buffer/grpo_advantages", "buffer/ref.logprob"} <= {n.name for n in plan.nodes}
    assert all("critic/score/mean" in m for m in metrics)
    adv = trainer.runtime.fetch(trainer.last_result, "buffer/grpo_advantages",
                                ("advantages",))["advantages"]
    uids = seen[max(seen)].rows["uid"]
    mask = seen[max(seen)].rows["response_mask"].float()
    assert len(adv) == len(uids) == 16
    per_row = (adv * mask).sum(-1) / mask.sum(-1).clamp(min=1)
    for uid in set(uids):
        rows = [i for i, u in enumerate(uids) if u == uid]
        assert len(rows) == 4 and abs(float(per_row[rows].sum())) < 1e-3, uid


def _check_the_background_loop(trainer, seen, tmp_path, k: int) -> None:
    """On Ray, with the rollout on its own pool: the engine loop ran on its worker's
    thread, the weights reached the rollout's own copy, and the stream side is on
    record (runtime/run_long/stream_record.py): the engine's work between polls on the rollout's
    pool, every decode step it counted, for the timeline. Each group went through the
    stream side's nodes once; at k = 2 (the next step's groups whole before a pass)
    some inside a training pass, beside the update, their records named as the
    plan's nodes."""
    assert trainer.scheduler.source.background
    plan = trainer.scheduler.source.plan
    assert {"reward.score", "grpo_advantages"} <= set(sides_of(plan).rollout)
    assert "ref.logprob" in sides_of(plan).train  # the reference is on the main pool
    assert all("critic/score/mean" in m for _, m, _ in seen.values())
    pairs = {(u, v) for rows, _, _ in seen.values()
             for u, v in zip(rows["uid"], rows["policy_version"].tolist())}
    assert {u for u, _ in pairs} == set(trained_uids(seen))
    last = seen[max(seen)].metrics
    assert last["engine/weight_sync_bytes"] > 0 and last["async/stream/decode_steps"] > 0
    (timeline,) = tmp_path.glob("*/timeline.jsonl")
    records = [json.loads(line) for line in timeline.read_text().splitlines()]
    stream = [r for r in records if r.get("stream")]
    assert {(r["stream"], r["pool"], r["node"]) for r in stream} == {
        ("poll", "gen", "rollout.generate")}
    assert sum(r["decode_steps"] for r in stream) == last["async/stream/decode_steps"]
    assert all("origin" in r for r in records)
    screened = sum(m["async/entrance/inside_groups"] + m["async/entrance/apart_groups"]
                   for _, m, _ in seen.values())
    assert screened >= len(set(trained_uids(seen)))
    names = {n.name for n in plan.nodes}
    assert {r["node"] for r in records} <= names, {r["node"] for r in records} - names
    if k > 1:
        assert sum(m["async/entrance/inside_groups"] for _, m, _ in seen.values()) > 0


def test_dapo_streams_with_its_filter_at_the_buffer_entrance(tmp_path, runtime_name):
    """`algorithm.overlong_buffer=0` turns the soft overlong penalty off, so the toy's
    scores are 0 or 1 and groups that score all the same (the ones DAPO drops) are
    common. The entrance pass (reward, penalty, filter) runs on the workers between
    polls; how many groups it drops depends on timing on Ray, so there only the
    accounting is checked."""
    steps, placed = DAPO[runtime_name]
    trainer, seen = run_recording(tmp_path, *STREAM, f"trainer.steps={steps}",
                                  "trainer.staleness=1", *CORRECTED,
                                  "algorithm.overlong_buffer=0", *placed, graph="dapo",
                                  keys=(*STREAM_KEYS, "scores"))
    check_rows(seen, 1)
    for rows, _, _ in seen.values():
        by_uid = {}
        for uid, score in zip(rows["uid"], rows["scores"].tolist()):
            by_uid.setdefault(uid, set()).add(score)
        assert len(by_uid) == 4 and all(len(s) > 1 for s in by_uid.values())  # all passed
    uids = trained_uids(seen)
    dropped = {u for s in seen for u in trainer.filtered[s]}
    assert len(uids) == len(set(uids)) == steps * 4 and not dropped & set(uids)
    metrics = [m for _, m, _ in seen.values()]
    # the gather's own names, as pipelined: batches' worth of groups dropped a step
    assert sum(m["gather/extra_rounds"] for m in metrics) * 4 == len(dropped)
    if runtime_name == "ray":  # the entrance pass ran there (in the steps whose polls
        # completed a group: which ones depends on timing, so not necessarily the last)
        assert any(m.get("timing_s/reward.score", 0) > 0 for m in metrics)
        return
    assert dropped  # some were dropped, none trained
    assert sum(m["dapo/dropped_groups_total"] for m in metrics) == len(dropped)
    drawn = {f"u{i}" for i in range(trainer.train_loader.served)}
    left = set(trainer.scheduler.source.prompts)
    assert set(uids) | dropped | left == drawn  # more drawn instead


def test_agent_episodes_stream_whole_with_one_version_each(tmp_path, runtime_name):
    """A poll plays 12 episodes (3 groups of n = 4) and a step takes 4 groups, so played
    groups wait a step and train one update old. The agent role lives in the actor's
    worker process, so its episodes stream by inline polls on Ray too (no thread)."""
    steps, placed = AGENT[runtime_name]
    trainer, seen = run_recording(tmp_path, *STREAM, f"trainer.steps={steps}",
                                  "trainer.staleness=1", *CORRECTED,
                                  "rollout.micro_batch_size=12", *placed, graph="agent_grpo")
    assert not trainer.scheduler.source.background
    check_rows(seen, 1)
    uids = trained_uids(seen)
    assert len(uids) == len(set(uids)) == steps * 4
    metrics = [m for _, m, _ in seen.values()]
    assert metrics[-1]["async/stream/episodes"] >= steps * 4 * 4
    if runtime_name == "ray":
        return
    for rows, _, _ in seen.values():
        for version, tokens, mask in zip(rows["policy_version"].tolist(),
                                         rows["token_versions"], rows["response_mask"].bool()):
            assert (tokens[mask] == version).all()  # one version per episode
    assert max(m["async/staleness/max"] for m in metrics) == 1  # some waited a step
    assert all(m["async/mixed_version_rows"] == 0 for m in metrics)
    assert all("actor/pg_loss" in m for m in metrics)


def test_the_local_streaming_schedule_is_deterministic(tmp_path):
    runs = [run_recording(tmp_path / name, *STREAM, "trainer.steps=4", "trainer.staleness=1",
                          *CORRECTED)[1] for name in ("a", "b")]
    for step in runs[0]:
        a, b = (run[step].rows for run in runs)
        assert list(a["uid"]) == list(b["uid"])
        assert torch.equal(a["token_versions"], b["token_versions"])


def _drawn(trainer) -> set[str]:
    return {f"u{i}" for i in range(trainer.train_loader.served)}


@pytest.mark.slow  # three runs
@pytest.mark.parametrize("k,partial", [
    (1, True), pytest.param(2, True, marks=pytest.mark.slow),
    pytest.param(1, False, marks=pytest.mark.slow),
    pytest.param(2, False, marks=pytest.mark.slow)])
def test_resume_redraws_in_flight_and_buffered_prompts_exactly_once(tmp_path, k, partial):
    """Checked against an uninterrupted run with the same seed: the steps before the
    save train the same groups; after the resume, no prompt trained before is trained
    again, the prompts in flight or buffered at the save are drawn again (the loader
    restored to before the oldest of them, the trained ones skipped), and at the end
    every prompt either run drew is trained once or still in flight, none lost."""
    args = (*STREAM, "trainer.steps=5", f"trainer.staleness={k}", "trainer.save_every=2",
            f"rollout.partial={str(partial).lower()}", *CORRECTED)
    whole_trainer, whole = run_recording(tmp_path / "whole", *args)
    part_trainer, part = run_recording(tmp_path / "part", *args, stop_after=3)
    assert part_trainer.saved_step == 2
    before = trained_uids({s: part[s] for s in (1, 2)})
    assert before == trained_uids({s: whole[s] for s in (1, 2)})
    resumed_trainer, resumed = run_recording(tmp_path / "part", *args,
                                             resume=part_trainer.run.path)
    assert sorted(resumed) == [3, 4, 5]
    after = trained_uids(resumed)
    trained = before + after
    assert len(trained) == len(set(trained)) == 5 * 4  # each prompt once
    for trainer, uids in ((whole_trainer, trained_uids(whole)), (resumed_trainer, trained)):
        left = set(trainer.scheduler.source.prompts)  # drawn, in flight when the run ended
        assert not left & set(uids) and set(uids) | left == _drawn(trainer)
    # the prompts drawn and untrained at the save were drawn again by the resumed run
    at_save = part[2].pending
    assert at_save and not at_save & set(before)
    assert at_save <= set(after) | set(resumed_trainer.scheduler.source.prompts)


@pytest.mark.slow  # a 30-step training run
def test_grpo_learns_streaming(tmp_path):
    trainer, metrics = train("grpo", tmp_path, "trainer.steps=30", "trainer.val_every=15",
                             "trainer.staleness=1", "trainer.async_mode=streaming",
                             "actor.off_policy=tis")
    scores = series(metrics, "critic/score/mean")
    accuracy = series(metrics, "val/toy_arith/greedy")
    assert sum(scores[-5:]) / 5 > sum(scores[:5]) / 5 + 0.1, scores
    assert accuracy[-1] > accuracy[0], accuracy
    assert trainer.run.status()["state"] == "finished"
