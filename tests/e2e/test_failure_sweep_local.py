"""Every way a run can fail ends the same: one console line naming where (node or
file) and the root cause's `Type: message` (whole, no colour codes, no traceback
fragment), the traceback in error.log, and status.json final (`failed`, with that
line). Failures injected inside libraries at each point of a run: a step on a
worker (torch's optimizer), a save (DCP's writer on a full disk, and the driver's own
file), a resume's load, and validation."""
from __future__ import annotations

import errno
import json
import os

import pytest

from hybridflow.cli import main
from tests.support.e2e import graph_file

SMALL = ("data.batch_size=4", "rollout.n=2", "actor.mini_batch_size=8",
         "actor.micro_batch_size=8", "trainer.progress=false")
COLOURED = "\x1b[31mexploded\x1b[0m in the library\nsecond line of its message"


def _run(capsys, tmp_path, *overrides) -> tuple[int, str]:
    code = main(["run", graph_file("grpo"), f"trainer.runs_dir={tmp_path}",
                 "trainer.run_name=run", *SMALL, *overrides])
    return code, capsys.readouterr().err


def _status(tmp_path) -> dict:
    with open(tmp_path / "run" / "status.json") as fh:
        return json.load(fh)


def _assert_one_line(err: str, *words: str) -> str:
    """The failure is one `hybridflow run:` line holding every word; nothing else of
    it reached the console (notes such as `changed on resume` are other lines)."""
    assert "\x1b" not in err and "Traceback" not in err, err
    lines = [line for line in err.splitlines()
             if line.startswith("hybridflow run:") and words[-1] in line]
    assert len(lines) == 1, err
    for word in words:
        assert word in lines[0], (word, lines[0])
    return lines[0].removeprefix("hybridflow run: ")


def _optimizer_raises(*args, **kwargs):
    raise RuntimeError(COLOURED)


def _disk_full(*args, **kwargs):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), "dcp/__0_0.distcp")


INJECTED = {  # point -> (what to patch, the replacement, the overrides, words of the line)
    "step on a worker": ("torch.optim.AdamW.step", _optimizer_raises, ("trainer.val_every=0",),
                         ("stopped at step 1", "node 'actor.update'", "role 'actor' rank 0",
                          "RuntimeError: exploded in the library")),
    "save on a worker": ("torch.distributed.checkpoint.filesystem._write_item", _disk_full,
                         ("trainer.val_every=0", "trainer.save_every=1"),
                         ("stopped at step 1", "'actor.save_checkpoint'",
                          "No space left on device")),
    "save on the driver": ("hybridflow.run.checkpoint.capture_rng", _disk_full,
                           ("trainer.val_every=0", "trainer.save_every=1"),
                           ("stopped at step 1", "No space left on device",
                            "dcp/__0_0.distcp")),
    "validation": ("hybridflow.run.loop.Trainer.validate", _optimizer_raises,
                   ("trainer.val_every=1",),
                   ("stopped at step 0", "RuntimeError: exploded in the library")),
}


@pytest.mark.parametrize("point", sorted(INJECTED))
def test_a_failure_is_one_line_and_a_final_status(capsys, tmp_path, monkeypatch, point):
    target, replacement, overrides, words = INJECTED[point]
    monkeypatch.setattr(target, replacement)
    code, err = _run(capsys, tmp_path, "trainer.steps=2", *overrides)
    assert code == 1
    line = _assert_one_line(err, *words)
    status = _status(tmp_path)
    assert status["state"] == "failed"
    assert status["reason"] in line
    log = (tmp_path / "run" / "error.log").read_text()
    assert "Traceback" in log
    checkpoints = tmp_path / "run" / "checkpoints"
    if checkpoints.exists():  # a failed save leaves no half-written checkpoint
        assert not [p for p in os.listdir(checkpoints) if p.startswith(".tmp")]


def test_a_resume_whose_load_fails_says_the_cause_and_leaves_the_run(capsys, tmp_path,
                                                                   monkeypatch):
    code, err = _run(capsys, tmp_path, "trainer.steps=1", "trainer.val_every=0")
    assert code == 0, err
    before = _status(tmp_path)
    from hybridflow.workers.actor import ActorWorker

    def missing(self, directory):
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT),
                                os.path.join(directory, "dcp", "__0_0.distcp"))
    monkeypatch.setattr(ActorWorker, "load_checkpoint", missing)
    code, err = _run(capsys, tmp_path, "trainer.steps=2", "trainer.val_every=0",
                     "--resume", str(tmp_path / "run"))
    assert code == 1
    _assert_one_line(err, "could not resume", "'actor.load_checkpoint'",
                     "FileNotFoundError: No such file or directory",
                     "step_000001/actor/dcp/__0_0.distcp")
    assert _status(tmp_path) == before  # a resume that did not start changes nothing
