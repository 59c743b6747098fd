"""A streaming run on Ray whose rollout worker (a pool of its own, the engine loop on
its background thread) is killed with SIGKILL while requests are in flight: the run
stops with an error naming the generate node, the role and the rank (no hang, no
silent exit), the last checkpoint stays intact, and `--resume` finishes the run with
every prompt trained exactly once.

The kill is real (SIGKILL of the worker's pid, from the driver); only its moment is
chosen, by a hook on the streaming scheduler: before its first poll of the engine from
step 3 on (while the buffer cannot fill the step, or the one after its pass), so the
poll is the next call to reach the dead worker. (A death that the train pass reaches
first is named by its weight sync node, with the same role and rank.)"""
from __future__ import annotations

import glob
import json
import os
import signal
import time

import pytest

from hybridflow.cli import main
from hybridflow.runtime.run_long.stream_source import StreamSource
from tests.support.async_runs import SPLIT
from tests.support.e2e import graph_file

pytestmark = [pytest.mark.ray, pytest.mark.slow,  # a streaming run killed and resumed on Ray
              pytest.mark.usefixtures("ray_session")]

ARMED, STEPS, PROMPTS = 3, 6, 4


def _dead(pid: int) -> bool:
    """Gone, or a zombie its parent (Ray's raylet) has not reaped yet."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


@pytest.fixture
def observed(monkeypatch):
    """Per run: the uids each trained step took (in order), the pid killed."""
    seen = {"trained": [], "killed": None, "step": 0, "killed_at": None}
    top_up, poll, trained = StreamSource._top_up, StreamSource._poll, StreamSource.trained

    def note_step(self, step, last_step):
        seen["step"] = step
        top_up(self, step, last_step)

    def kill_mid_stream(self, *args, **kwargs):
        """Before the first poll from step ARMED on (a step polls while the buffer
        cannot fill it, and once after its pass): this poll is the next call to reach
        the rollout worker."""
        if seen["step"] >= ARMED and seen["killed"] is None:
            assert self.background and self.ledger.expected  # requests in flight
            (info,) = self.runtime.worker_info("gen")
            seen["killed"], seen["killed_at"] = info["pid"], seen["step"]
            os.kill(info["pid"], signal.SIGKILL)
            deadline = time.time() + 30
            while not _dead(info["pid"]) and time.time() < deadline:
                time.sleep(0.05)
        return poll(self, *args, **kwargs)

    def record(self, step, last_step, taken):
        seen["trained"].append([uid for uid, _ in taken])
        trained(self, step, last_step, taken)

    monkeypatch.setattr(StreamSource, "_top_up", note_step)
    monkeypatch.setattr(StreamSource, "_poll", kill_mid_stream)
    monkeypatch.setattr(StreamSource, "trained", record)
    return seen


def test_a_killed_streaming_rollout_worker_stops_the_run_and_resume_finishes_it(
        tmp_path, observed):
    args = [graph_file("grpo"), "--runtime", "ray", f"trainer.runs_dir={tmp_path}/runs",
            "trainer.run_name=killed", f"trainer.steps={STEPS}", "trainer.save_every=2",
            "trainer.staleness=1", "trainer.async_mode=streaming",
            "actor.off_policy=decoupled", *SPLIT, "runtime.torch_threads=1",
            "trainer.val_every=0", "trainer.progress=false", f"data.batch_size={PROMPTS}",
            "rollout.n=2", "actor.micro_batch_size=8", "actor.mini_batch_size=8",
            "runtime.call_timeout_s=60"]
    # a hang fails on pytest-timeout's 600 s (pyproject); the run must stop on its own
    assert main(["run", *args]) == 1
    killed_at = observed["killed_at"]
    assert killed_at is not None, "no poll from step 3 on: the worker was never killed"
    assert _dead(observed["killed"]), observed
    run_dir = os.path.join(tmp_path, "runs", "killed")
    status = json.load(open(os.path.join(run_dir, "status.json")))
    assert status["state"] == "failed" and status["step"] == killed_at
    reason = status["reason"]
    assert "node 'rollout.generate'" in reason, reason
    assert "role 'rollout' rank 0" in reason and "died" in reason, reason
    saved = (killed_at - 1) // 2 * 2  # trainer.save_every=2
    assert sorted(os.path.basename(p) for p in glob.glob(f"{run_dir}/checkpoints/step_*")) \
        == [f"step_{s:06d}" for s in range(2, saved + 1, 2)]
    assert len(observed["trained"]) == killed_at - 1  # the killed step never trained
    before = observed["trained"][:saved]  # what the checkpoint holds as trained

    observed["trained"] = []
    assert main(["run", graph_file("grpo"), "--resume", run_dir, "--runtime", "ray"]) == 0
    status = json.load(open(os.path.join(run_dir, "status.json")))
    assert status["state"] == "finished" and status["step"] == STEPS
    steps = [json.loads(line)["step"] for line in open(os.path.join(run_dir, "metrics.jsonl"))]
    assert steps == list(range(1, STEPS + 1))
    trained = [u for uids in before + observed["trained"] for u in uids]
    assert len(trained) == len(set(trained)) == STEPS * PROMPTS  # each prompt once
