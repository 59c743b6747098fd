"""Resume on the local runtime is safe: a run that is still going is not resumed, a
resume that does not match the run (another graph, a changed config) is refused
before anything in the run directory is written, damage is detected and named,
and a run killed with SIGKILL is told apart from a live one and taken over."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from hybridflow.cli import main
from tests.support.e2e import REPO, graph_file

SMALL = ("trainer.val_every=0", "data.batch_size=4", "rollout.n=2", "actor.mini_batch_size=8",
         "actor.micro_batch_size=8", "trainer.save_every=1", "trainer.progress=false")


def _run(capsys, tmp_path, *args, graph=None) -> tuple[int, str]:
    code = main(["run", graph or graph_file("grpo"), f"trainer.runs_dir={tmp_path}",
                 "trainer.run_name=run", *SMALL, *args])
    return code, capsys.readouterr().err


def _snapshot(run_dir: str) -> dict:
    """Every file of the run directory and its bytes."""
    out = {}
    for root, _, names in os.walk(run_dir):
        for name in names:
            path = os.path.join(root, name)
            out[os.path.relpath(path, run_dir)] = open(path, "rb").read()
    return out


def _steps(run_dir: str) -> list[int]:
    with open(os.path.join(run_dir, "metrics.jsonl")) as fh:
        return [json.loads(line)["step"] for line in fh if line.strip()]


def test_resume_of_a_run_that_is_still_going_is_refused(capsys, tmp_path):
    code, _ = _run(capsys, tmp_path, "trainer.steps=1")
    assert code == 0
    run_dir = str(tmp_path / "run")
    from hybridflow.run.lock import RunLock
    with RunLock(run_dir):  # this live process owns it, as a running trainer would
        before = _snapshot(run_dir)
        code, err = _run(capsys, tmp_path, "trainer.steps=2", "--resume", run_dir)
        assert code == 1
        assert f"hybridflow run: run directory {run_dir} is still running (pid {os.getpid()} " \
               f"on " in err and "stop it first" in err
        assert _snapshot(run_dir) == before


def test_resume_with_another_graph_changes_nothing(capsys, tmp_path):
    code, _ = _run(capsys, tmp_path, "trainer.steps=1")
    assert code == 0
    run_dir = str(tmp_path / "run")
    before = _snapshot(run_dir)
    code, err = _run(capsys, tmp_path, "trainer.steps=2", "--resume", run_dir,
                     graph=graph_file("ppo"))
    assert code == 1
    assert (f"hybridflow run: --resume {run_dir}: the run was made by graph 'grpo' "
            f"({graph_file('grpo')}), not 'ppo' ({graph_file('ppo')})") in err
    assert _snapshot(run_dir) == before  # config.yaml and status.json ('finished') intact


def test_a_config_that_differs_without_being_asked_is_listed_key_by_key(capsys, tmp_path):
    """The graph file gained an algorithm knob since the run started: the file
    change is a warning, the config change an error listing the key."""
    graph = tmp_path / "mine.py"
    source = open(graph_file("grpo")).read()
    graph.write_text(source)
    code, _ = _run(capsys, tmp_path, "trainer.steps=1", graph=str(graph))
    assert code == 0
    run_dir = str(tmp_path / "run")
    knob = "    norm_by_std: bool = True"
    assert knob in source  # a field of the graph's ALGORITHM dataclass
    graph = tmp_path / "mine_edited.py"  # a fresh file: this process cached the first
    graph.write_text(source.replace(knob, "    new_knob: int = 7\n" + knob, 1))
    before = _snapshot(run_dir)
    code, err = _run(capsys, tmp_path, "trainer.steps=2", "--resume", run_dir, graph=str(graph))
    assert code == 1, err
    assert (f"graph file {graph} differs from the one the run started with "
            f"({tmp_path / 'mine.py'}, sha256 ") in err
    assert "the configuration differs from the run's config.yaml:\n" \
           "  algorithm.new_knob: '<unset>' (saved) -> 7\n" in err
    assert _snapshot(run_dir) == before
    # asked for on purpose, the same change is accepted and said
    code, err = _run(capsys, tmp_path, "trainer.steps=2", "algorithm.new_knob=7", "--resume",
                     run_dir, graph=str(graph))
    assert code == 0, err
    assert "changed on resume: algorithm.new_knob: '<unset>' -> 7" in err
    assert "changed on resume: trainer.steps: 1 -> 2" in err
    assert _steps(run_dir) == [1, 2]


def test_a_checkpoint_damaged_in_place_is_named_and_the_run_is_left_alone(capsys, tmp_path):
    code, _ = _run(capsys, tmp_path, "trainer.steps=2")
    assert code == 0
    run_dir = str(tmp_path / "run")
    weights = os.path.join(run_dir, "checkpoints", "step_000002", "actor", "dcp",
                           "__0_0.distcp")  # rank 0's shard of the weights and optimizer
    data = bytearray(open(weights, "rb").read())
    data[-5] ^= 0xFF  # same size, other bytes
    open(weights, "wb").write(bytes(data))
    before = _snapshot(run_dir)
    code, err = _run(capsys, tmp_path, "trainer.steps=3", "--resume", run_dir)
    assert code == 1
    assert (f"hybridflow run: --resume {run_dir}: checkpoint "
            f"{run_dir}/checkpoints/step_000002 is damaged: actor/dcp/__0_0.distcp does not "
            f"match its sha256") in err
    assert f"delete {run_dir}/checkpoints/step_000002 to resume from step_000001" in err
    assert _snapshot(run_dir) == before  # refused before a worker started: no error.log


def test_a_torn_last_metrics_line_is_trimmed_on_resume(capsys, tmp_path):
    code, _ = _run(capsys, tmp_path, "trainer.steps=2")
    assert code == 0
    run_dir = str(tmp_path / "run")
    with open(os.path.join(run_dir, "metrics.jsonl"), "a") as fh:
        fh.write('{"step": 3, "actor/pg_loss": 0.')  # what a crash mid-write leaves
    code, err = _run(capsys, tmp_path, "trainer.steps=3", "--resume", run_dir)
    assert code == 0, err
    assert f"{run_dir}/metrics.jsonl:3: dropped a torn last line" in err
    assert f"resumed from {run_dir}/checkpoints/step_000002 (step 2)" in err
    assert _steps(run_dir) == [1, 2, 3]


def _wait_for_step(run_dir: str, step: int, process, timeout: float = 300.0) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert process.poll() is None, "the run ended before it was killed"
        try:
            status = json.load(open(os.path.join(run_dir, "status.json")))
        except (OSError, ValueError):
            status = {}
        if status.get("step", 0) >= step:
            return status
        time.sleep(0.2)
    raise AssertionError(f"no step {step} within {timeout}s")


@pytest.mark.slow  # a run in a subprocess, killed, then resumed (~25 s)
def test_a_sigkilled_run_is_told_from_a_live_one_and_taken_over(capsys, tmp_path):
    run_dir = str(tmp_path / "run")
    env = {**os.environ, "PYTHONPATH": REPO}
    process = subprocess.Popen(
        [sys.executable, "-m", "hybridflow", "run", graph_file("grpo"),
         f"trainer.runs_dir={tmp_path}", "trainer.run_name=run", *SMALL, "trainer.steps=200"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_for_step(run_dir, 2, process)
        assert main(["status", run_dir]) == 0
        assert f"running (pid {process.pid} on " in capsys.readouterr().out
    finally:
        process.send_signal(signal.SIGKILL)
        process.wait()
    status = json.load(open(os.path.join(run_dir, "status.json")))
    assert status["state"] == "running" and status["step"] >= 2  # what SIGKILL leaves
    assert main(["status", run_dir]) == 0
    out = capsys.readouterr().out
    assert f"died without a word at step {status['step']}/200 (pid {process.pid} on " in out

    step = status["step"]
    code, err = _run(capsys, tmp_path, f"trainer.steps={step + 1}", "--resume", run_dir)
    assert code == 0, err
    assert f"taking over a lock of pid {process.pid} on " in err and "which is gone" in err
    saved = json.load(open(os.path.join(run_dir, "status.json")))
    assert saved["state"] == "finished" and saved["step"] == step + 1
    steps = _steps(run_dir)
    assert steps == sorted(set(steps)) and steps[-1] == step + 1  # no duplicates, in order
