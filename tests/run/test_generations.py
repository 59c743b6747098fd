"""Sample generations (run/generations.py): written to generations.jsonl at every
validation (on by default) and training step (trainer.log_generations), printed at
validation, sent to TensorBoard, trimmed with the metrics on resume."""
import json
import os

from hybridflow.run.generations import format_samples, pick_rows
from hybridflow.run.tracking import RunDir
from tests.support.e2e import train

FAST = ("data.batch_size=4", "rollout.n=2", "actor.mini_batch_size=8", "trainer.val_samples=1")


def _records(trainer):
    with open(trainer.run.file("generations.jsonl")) as fh:
        return [json.loads(line) for line in fh]


def test_pick_rows_spreads_over_the_batch():
    assert pick_rows(16, 4) == [0, 4, 8, 12]  # one response of each prompt's group
    assert pick_rows(3, 5) == [0, 1, 2]
    assert pick_rows(10, 0) == [] and pick_rows(0, 3) == []


def test_validation_and_training_samples_are_written_and_validation_is_printed(
        tmp_path, capsys):
    trainer, metrics = train("grpo", tmp_path, "trainer.steps=2", "trainer.val_every=2",
                             "trainer.log_generations=3", "trainer.log_val_generations=2",
                             "trainer.tensorboard=true", *FAST)
    records = _records(trainer)
    val = [r for r in records if r["split"] == "val"]
    assert [r["step"] for r in val] == [0, 0, 2, 2]
    assert [r["step"] for r in records if r["split"] == "train"] == [1, 1, 1, 2, 2, 2]
    for r in records:
        assert set(r) == {"step", "split", "prompt", "response", "score", "ground_truth",
                          "data_source"}
        assert r["prompt"].endswith("=") and r["data_source"] == "toy_arith"
        assert r["score"] in (0.0, 1.0)
    # the logged greedy scores are the ones validation averaged: same rows, same scorer
    held_out = [m["val/toy_arith/greedy"] for m in metrics if "val/toy_arith/greedy" in m]
    assert len(held_out) == 2
    printed = capsys.readouterr().out
    assert printed.count("[val step 0]") == 2 and printed.count("[val step 2]") == 2
    assert "[train" not in printed  # training samples go to the file only
    assert f"prompt:   {val[0]['prompt']}" in printed


def test_no_training_samples_by_default_and_none_at_all_when_off(tmp_path):
    trainer, _ = train("grpo", tmp_path, "trainer.steps=1", "trainer.val_every=1", *FAST)
    assert {r["split"] for r in _records(trainer)} == {"val"}
    assert len(_records(trainer)) == 8  # the default: 4 at step 0, 4 at step 1
    off, _ = train("grpo", tmp_path, "trainer.steps=1", "trainer.val_every=1",
                   "trainer.log_val_generations=0", *FAST)
    assert not os.path.exists(off.run.file("generations.jsonl"))


def test_resume_drops_the_samples_of_steps_after_the_checkpoint(tmp_path):
    run = RunDir(str(tmp_path / "r"))
    with open(run.file("generations.jsonl"), "w") as fh:
        for step in (0, 1, 2, 3):
            fh.write(json.dumps({"step": step, "split": "val"}) + "\n")
    run.truncate_metrics(2)
    with open(run.file("generations.jsonl")) as fh:
        assert [json.loads(line)["step"] for line in fh] == [0, 1, 2]


def test_printed_samples_are_one_line_each_and_cut():
    text = format_samples([{"step": 3, "split": "val", "score": 1.0, "ground_truth": "12",
                            "prompt": "a\nb", "response": "x" * 1000}])
    lines = text.splitlines()
    assert lines[0] == "[val step 3] score=1 truth='12'"
    assert lines[1] == "  prompt:   a\\nb"
    assert lines[2].endswith("...") and len(lines[2]) < 400
