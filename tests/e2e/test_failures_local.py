"""Failures during a run on the local runtime: NaN rewards or losses and a worker
that raises stop the run with one line naming node and step; status.json records
why (with the traceback); the last good checkpoint is intact and loads."""
from __future__ import annotations

import json
import os
import re
import shutil
import textwrap

import pytest

from hybridflow.run.checkpoint import latest_checkpoint, load_trainer_state
from hybridflow.cli import main
from tests.support.e2e import REPO, graph_file

# 8 rows a step (4 prompts x 2 samples); no validation, so the scorer sees train rows only
SMALL = ("trainer.val_every=0", "data.batch_size=4", "rollout.n=2", "actor.mini_batch_size=8",
         "actor.micro_batch_size=8", "trainer.save_every=1", "trainer.progress=false")


def run(capsys, tmp_path, *overrides, graph="grpo") -> tuple[int, str, dict, str]:
    """`hybridflow run` into tmp_path/run; exit code, stderr, status.json, run dir."""
    path = graph if os.path.isfile(graph) else graph_file(graph)
    code = main(["run", path, f"trainer.runs_dir={tmp_path}", "trainer.run_name=run",
                 *SMALL, *overrides])
    err = capsys.readouterr().err
    run_dir = str(tmp_path / "run")
    with open(os.path.join(run_dir, "status.json")) as fh:
        return code, err, json.load(fh), run_dir


def scorer(tmp_path, body: str) -> str:
    """A scorer that answers 1.0 for its first 16 rows (two steps), then runs `body`."""
    path = tmp_path / "scorer.py"
    path.write_text(textwrap.dedent(f"""
        import math
        calls = 0
        def compute_score(data_source, solution_str, ground_truth, extra_info=None):
            global calls
            calls += 1
            if calls <= 16:
                return 1.0
            {body}
    """))
    return str(path)


def test_nan_reward_stops_the_run_naming_node_and_step_and_keeps_the_checkpoint(
        capsys, tmp_path):
    code, err, status, run_dir = run(capsys, tmp_path, "trainer.steps=5",
                                     f"reward.function_path={scorer(tmp_path, 'return math.nan')}")
    assert code == 1
    assert "hybridflow run: stopped at step 3: node 'reward.score'" in err
    assert "failed on role 'reward' rank 0: ScoringError: reward scorer returned nan" in err
    assert "Traceback" not in err
    assert status["state"] == "failed" and status["step"] == 3
    assert status["node"] == "reward.score" and status["rank"] == 0
    assert "returned nan" in status["reason"] and "Traceback" in status["traceback"]
    last = latest_checkpoint(os.path.join(run_dir, "checkpoints"))
    assert last.endswith("step_000002")
    state, _ = load_trainer_state(last)
    assert state["step"] == 2
    assert [m["step"] for m in _metrics(run_dir) if m["step"] > 0] == [1, 2]


def test_a_scorer_that_raises_is_reported_with_node_role_and_rank(capsys, tmp_path):
    path = scorer(tmp_path, 'raise ValueError("cannot parse " + solution_str[:5])')
    code, err, status, run_dir = run(capsys, tmp_path, "trainer.steps=4",
                                     f"reward.function_path={path}")
    assert code == 1
    assert "stopped at step 3: node 'reward.score'" in err
    assert "reward scorer failed on row 0" in err and "ValueError: cannot parse" in err
    lines = [line for line in err.splitlines() if line.strip() and "Loading weights" not in line]
    assert len(lines) == 2 and "Traceback" not in err  # one line, and where to look
    assert lines[1] == f"(details: {run_dir}/error.log)"
    assert status["state"] == "failed" and status["error"] == "NodeFailure"
    log = open(os.path.join(run_dir, "error.log")).read()
    assert "Traceback" in log and "ValueError: cannot parse" in log


NAN_LOSS_GRAPH = '''
import torch
from graphs.grpo import defaults
from hybridflow import Batch, Graph, node_fn

calls = 0


@node_fn(reads=("scores", "uid", "response_mask"), writes=("advantages",), group_by="uid")
def advantages_nan_from_step_2(batch):
    global calls
    calls += 1
    value = float("nan") if calls >= 2 else 0.5
    return Batch({"advantages": torch.full(batch["response_mask"].shape, value)})


def build(cfg):
    g = Graph("nan_loss")
    prompts = g.source("prompts")
    rollout = g.call("actor.generate", prompts, n=cfg.rollout.n)
    old = g.call("actor.logprob", rollout)
    ref = g.call("ref.logprob", rollout)
    score = g.call("reward.score", rollout)
    adv = g.fn(advantages_nan_from_step_2, rollout, score)
    g.call("actor.update", rollout, old, ref, adv)
    return g
'''


def test_nan_loss_stops_the_run_naming_node_and_step(capsys, tmp_path):
    graph = tmp_path / "nan_loss.py"
    graph.write_text(NAN_LOSS_GRAPH)
    code, err, status, run_dir = run(capsys, tmp_path, "trainer.steps=4", graph=str(graph))
    assert code == 1
    assert re.search(r"stopped at step 2: node 'actor.update' produced "
                     r"actor/(pg_loss|grad_norm)=nan; the run stops and the last good "
                     r"checkpoint is kept", err), err
    assert status["state"] == "failed" and status["error"] == "NumericsError"
    assert latest_checkpoint(os.path.join(run_dir, "checkpoints")).endswith("step_000001")


def test_a_worker_that_fails_to_start_is_one_line_and_recorded(capsys, tmp_path):
    # a whole, well-formed weight file (it passes the checks before launch) whose
    # tensors do not fit the model: only loading it in the worker finds that
    from safetensors.torch import load_file, save_file
    model = tmp_path / "model"
    shutil.copytree(os.path.join(REPO, "graphs", "assets", "toy_base"), model)
    weights = load_file(str(model / "model.safetensors"))
    name = next(k for k in weights if k.endswith("q_proj.weight"))
    weights[name] = weights[name][:-1].contiguous()
    save_file(weights, str(model / "model.safetensors"), metadata={"format": "pt"})
    # transformers logs a load report for the misfit tensor; a logging handler left holding
    # an earlier test's captured stream would print its own traceback into stderr
    from transformers.utils import logging as hf_logging
    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        code, err, status, _ = run(capsys, tmp_path, "trainer.steps=2", f"model.path={model}",
                                   f"model.tokenizer={model}")
    finally:
        hf_logging.set_verbosity(level)
    assert code == 1
    # (a note on the toy-sized defaults may come first: model.path is not the toy's path)
    failed = [line for line in err.splitlines() if line.startswith("hybridflow run: could not")]
    assert failed and failed[0].startswith("hybridflow run: could not start: ")
    assert "Traceback" not in err
    assert status["state"] == "failed" and status["step"] == 0


def _metrics(run_dir: str) -> list[dict]:
    with open(os.path.join(run_dir, "metrics.jsonl")) as fh:
        return [json.loads(line) for line in fh if line.strip()]


def test_a_nan_score_from_a_reward_model_is_caught_by_the_finite_check():
    """A reward model (no rule scorer to refuse NaN) reports its mean score as a
    metric; the step loop's finite check stops on it, naming node and step."""
    from hybridflow.run.loop import NumericsError, check_finite
    with pytest.raises(NumericsError, match=r"step 4: node 'reward.score' produced "
                                            r"critic/score/mean=nan"):
        check_finite(4, {"actor.generate": {"response_length/mean": 3.0},
                         "reward.score": {"critic/score/mean": float("nan")}})
    check_finite(4, {"reward.score": {"critic/score/mean": 0.5}})


# ------------------------------------------------- user exits, signals, full disk
def test_a_scorer_calling_sys_exit_fails_the_run_naming_the_file(capsys, tmp_path):
    """User code cannot end the run silently: the exit is a failure naming the line."""
    path = scorer(tmp_path, "import sys; sys.exit(3)")
    code, err, status, run_dir = run(capsys, tmp_path, "trainer.steps=4",
                                     f"reward.function_path={path}")
    assert code == 1
    assert "hybridflow run: stopped at step 3: node 'reward.score'" in err  # issue 26: and
    assert f"compute_score() at {path}:9 called sys.exit(3)" in err  # the node is named
    assert status["state"] == "failed" and status["step"] == 3
    assert status["node"] == "reward.score"
    assert not os.path.exists(os.path.join(run_dir, "lock.json"))


def test_a_function_node_calling_sys_exit_fails_the_run_naming_the_file(capsys, tmp_path):
    graph = tmp_path / "exits.py"
    graph.write_text(NAN_LOSS_GRAPH.replace(
        'value = float("nan") if calls >= 2 else 0.5',
        'value = 0.5\n    if calls >= 2:\n        raise SystemExit("bye")'))
    code, err, status, _ = run(capsys, tmp_path, "trainer.steps=3", graph=str(graph))
    assert code == 1
    assert "stopped at step 2: node 'advantages_nan_from_step_2'" in err
    assert f"advantages_nan_from_step_2() at {graph}:15 called sys.exit('bye')" in err
    assert status["state"] == "failed" and status["node"] == "advantages_nan_from_step_2"


def _signal_scorer(tmp_path, times: int) -> str:
    """A scorer that, on step 3's first row, sends this process SIGTERM `times` times."""
    return scorer(tmp_path, f"""
            import os, signal
            if calls == 17:
                for _ in range({times}):
                    os.kill(os.getpid(), signal.SIGTERM)
            return 1.0""".strip())


def test_sigterm_finishes_the_step_saves_and_records_interrupted(capsys, tmp_path):
    """What a scheduler or preemption sends: the step finishes, a checkpoint is saved,
    status.json says interrupted, the exit code is 128 + 15, and --resume continues."""
    code, err, status, run_dir = run(capsys, tmp_path, "trainer.steps=5",
                                     "trainer.save_every=0",
                                     f"reward.function_path={_signal_scorer(tmp_path, 1)}")
    assert code == 143
    assert "SIGTERM: stopping after this step, with a checkpoint" in err
    saved = os.path.join(run_dir, "checkpoints", "step_000003")
    assert (f"hybridflow run: SIGTERM: stopped at step 3 (checkpoint {saved}); resume with: "
            f"hybridflow run {graph_file('grpo')} --resume {run_dir}") in err
    assert status["state"] == "interrupted" and status["signal"] == "SIGTERM"
    assert status["step"] == 3 and status["checkpoint"] == saved
    assert latest_checkpoint(os.path.join(run_dir, "checkpoints")) == saved
    assert [m["step"] for m in _metrics(run_dir)] == [1, 2, 3]
    assert not os.path.exists(os.path.join(run_dir, "lock.json"))

    code = main(["run", graph_file("grpo"), "--resume", run_dir, f"trainer.runs_dir={tmp_path}",
                 "trainer.run_name=run", *SMALL, "trainer.steps=5", "trainer.save_every=0",
                 f"reward.function_path={tmp_path / 'scorer.py'}"])
    err = capsys.readouterr().err
    assert code == 0, err
    assert f"hybridflow run: resumed from {saved} (step 3)" in err
    assert [m["step"] for m in _metrics(run_dir)] == [1, 2, 3, 4, 5]
    assert json.load(open(os.path.join(run_dir, "status.json")))["state"] == "finished"


def test_a_second_sigterm_stops_at_once_keeping_the_last_checkpoint(capsys, tmp_path):
    code, err, status, run_dir = run(capsys, tmp_path, "trainer.steps=5",
                                     f"reward.function_path={_signal_scorer(tmp_path, 2)}")
    assert code == 143
    assert "Traceback" not in err
    assert status["state"] == "interrupted" and status["signal"] == "SIGTERM"
    assert status["checkpoint"].endswith("step_000002")
    assert latest_checkpoint(os.path.join(run_dir, "checkpoints")).endswith("step_000002")


def test_status_records_the_step_after_every_step(capsys, tmp_path, monkeypatch):
    """status.json is the truth while the run goes, not only at its end."""
    from hybridflow.run.tracking import RunDir
    seen, set_status = [], RunDir.set_status

    def spy(self, state, **info):
        seen.append((state, info.get("step")))
        set_status(self, state, **info)

    monkeypatch.setattr(RunDir, "set_status", spy)
    code, _, status, _ = run(capsys, tmp_path, "trainer.steps=3")
    assert code == 0
    assert seen == [("starting", 0), ("running", 0), ("running", 1), ("running", 2), ("running", 3),
                    ("finished", 3)]
    assert status["steps"] == 3 and status["pid"] == os.getpid()


def test_a_full_disk_is_one_line_and_leaves_no_temporary_files(capsys, tmp_path, monkeypatch):
    """The checkpoint write fails with ENOSPC, then so do the failure handler's own
    status and log writes: one line, notes for what could not be recorded, no
    `.tmp` left behind, and the lock released."""
    import errno

    import hybridflow.run.checkpoint as checkpoint
    from hybridflow.run.tracking import RunDir
    full = []
    manifest, fsync, log_error = checkpoint._manifest, os.fsync, RunDir.log_error

    def no_space(path):
        full.append(path)
        return OSError(errno.ENOSPC, "No space left on device", path)

    def failing_manifest(path, step):
        if step >= 2:
            raise no_space(os.path.join(path, "actor", "model.safetensors"))
        return manifest(path, step)

    def failing_fsync(fd):
        if full:
            raise no_space("status.json")
        fsync(fd)

    def failing_log(self, text):
        if full:
            raise no_space(self.file("error.log"))
        return log_error(self, text)

    monkeypatch.setattr(checkpoint, "_manifest", failing_manifest)
    monkeypatch.setattr(os, "fsync", failing_fsync)
    monkeypatch.setattr(RunDir, "log_error", failing_log)
    code, err, status, run_dir = run(capsys, tmp_path, "trainer.steps=4")
    assert code == 1
    lines = [line for line in err.splitlines() if line.startswith("hybridflow run:")]
    assert lines[0].startswith("hybridflow run: stopped at step 2: '") and \
        lines[0].endswith("step_000002/actor/model.safetensors': No space left on device")
    assert f"hybridflow run: could not write {run_dir}/error.log: No space left on device" in err
    assert (f"hybridflow run: could not record 'failed' in {run_dir}/status.json: No space "
            f"left on device") in err
    assert "Traceback" not in err
    left = [name for _, dirs, files in os.walk(run_dir) for name in dirs + files
            if "tmp" in name]
    assert left == []
    assert status["state"] == "running" and status["step"] == 1  # the last true record
    assert not os.path.exists(os.path.join(run_dir, "lock.json"))
