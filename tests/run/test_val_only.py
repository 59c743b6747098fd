"""Evaluating a checkpoint (issue 32, class 10): a finished run's last step is
validated whatever `trainer.val_every`; `trainer.val_only=true` validates a run
directory's checkpoint (`--resume RUN_DIR`) or a model directory (`model.path`) once,
logs the graph's validation metrics and generations at that step, and trains and
saves nothing (the run's config.yaml and checkpoints are left as they were)."""
from __future__ import annotations

import json
import os

import pytest

from hybridflow.cli import main
from tests.support.e2e import graph_file

SMALL = ("trainer.val_every=2", "data.batch_size=4", "rollout.n=2",
         "actor.mini_batch_size=8", "trainer.progress=false", "trainer.steps=3")


def _records(run_dir) -> list[dict]:
    with open(os.path.join(run_dir, "metrics.jsonl")) as fh:
        return [json.loads(line) for line in fh if line.strip()]


def _validated(run_dir) -> list[int]:
    return [r["step"] for r in _records(run_dir) if "val/toy_arith/greedy" in r]


def _files(path) -> dict:
    return {os.path.join(root, name): os.path.getmtime(os.path.join(root, name))
            for root, _, names in os.walk(path) for name in names}


@pytest.mark.slow  # a 3-step run, then a validation of its checkpoint
def test_a_finished_run_validates_its_last_step_and_val_only_validates_a_checkpoint(
        capsys, tmp_path):
    args = [f"trainer.runs_dir={tmp_path}", "trainer.run_name=run", *SMALL]
    assert main(["run", graph_file("grpo"), *args]) == 0
    run_dir = tmp_path / "run"
    assert _validated(run_dir) == [0, 2, 3]  # 3: the last step, though val_every=2
    config = (run_dir / "config.yaml").read_text()
    saved = _files(run_dir / "checkpoints")
    capsys.readouterr()

    assert main(["run", graph_file("grpo"), "--resume", str(run_dir), *args,
                 "trainer.val_only=true"]) == 0
    out, err = capsys.readouterr()
    assert f"resumed from {run_dir}/checkpoints/step_000003 (step 3)" in err
    assert "val/toy_arith/greedy:" in out
    assert _validated(run_dir) == [0, 2, 3, 3]
    assert (run_dir / "config.yaml").read_text() == config  # val_only is not recorded
    assert _files(run_dir / "checkpoints") == saved  # nothing trained or saved
    status = json.loads((run_dir / "status.json").read_text())
    assert status["state"] == "finished" and status["validated"] == 3
    generations = [json.loads(line) for line in open(run_dir / "generations.jsonl")]
    steps = [g["step"] for g in generations if g["split"] == "val"]
    assert steps.count(3) == 2 * steps.count(0) > 0  # its generations, at step 3 twice


@pytest.mark.slow  # one validation of a model directory
def test_val_only_validates_a_model_directory(capsys, tmp_path):
    model = os.path.join(os.path.dirname(graph_file("grpo")), "assets", "toy_base")
    assert main(["run", graph_file("grpo"), f"trainer.runs_dir={tmp_path}",
                 "trainer.run_name=run", *SMALL, f"model.path={model}",
                 "trainer.val_only=true"]) == 0
    run_dir = tmp_path / "run"
    assert _validated(run_dir) == [0]
    assert not os.path.exists(run_dir / "checkpoints") or \
        not os.listdir(run_dir / "checkpoints")
    assert json.loads((run_dir / "status.json").read_text())["state"] == "finished"


def test_val_only_without_held_out_prompts_is_refused_by_check(capsys, tmp_path):
    train = tmp_path / "train.jsonl"
    train.write_text('{"prompt": "1+1=", "data_source": "toy_arith", '
                     '"reward_model": {"ground_truth": "2"}}\n' * 4)
    code = main(["check", graph_file("grpo"), f"data.train_files={train}",
                 "data.batch_size=4", "actor.mini_batch_size=8", "trainer.val_only=true"])
    err = capsys.readouterr().err
    assert code == 1
    assert "trainer.val_only=true validates on held-out prompts, but data.train_files is " \
           "set without data.val_files; set data.val_files" in err
