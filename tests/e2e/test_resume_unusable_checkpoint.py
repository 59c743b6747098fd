"""Issue 36, item 0: a resume that finds no usable checkpoint never rewrites the run.

Every way a run with history can lack a usable checkpoint (no checkpoints folder, an
empty one, a write cut short, a manifest missing, damaged, of another step or naming
a missing file, a file changed since it was saved, a newer partial step directory),
resumed in every mode (training on, validation only), is refused with one line that
names the checkpoint (or folder) and what is wrong, before a worker starts, and
leaves every file of the run directory byte for byte as it was."""
from __future__ import annotations

import json
import os
import shutil

import pytest

from hybridflow.cli import main
from tests.support.e2e import graph_file

SMALL = ("trainer.val_every=0", "data.batch_size=4", "rollout.n=2", "actor.mini_batch_size=8",
         "actor.micro_batch_size=8", "trainer.save_every=1", "trainer.progress=false")
STEP = "step_000002"


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> str:
    """A finished 2-step run that keeps one checkpoint (step 2), as the issue's."""
    root = tmp_path_factory.mktemp("base")
    code = main(["run", graph_file("grpo"), f"trainer.runs_dir={root}", "trainer.run_name=run",
                 *SMALL, "trainer.steps=2", "trainer.max_checkpoints=1"])
    assert code == 0
    run_dir = str(root / "run")
    assert sorted(os.listdir(os.path.join(run_dir, "checkpoints"))) == [STEP]
    return run_dir


def _snapshot(run_dir: str) -> dict:
    """Every file and directory of the run directory, a file with its bytes."""
    out = {}
    for root, dirs, names in os.walk(run_dir):
        for name in dirs:
            out[os.path.relpath(os.path.join(root, name), run_dir) + "/"] = None
        for name in names:
            path = os.path.join(root, name)
            with open(path, "rb") as fh:
                out[os.path.relpath(path, run_dir)] = fh.read()
    return out


def _ckpt(run_dir: str, *parts: str) -> str:
    return os.path.join(run_dir, "checkpoints", *parts)


def _manifest(run_dir: str) -> str:
    return _ckpt(run_dir, STEP, "manifest.json")


def _rewrite_manifest(run_dir: str, change) -> None:
    with open(_manifest(run_dir)) as fh:
        record = json.load(fh)
    change(record)
    with open(_manifest(run_dir), "w") as fh:
        json.dump(record, fh)


def _no_folder(run_dir):
    shutil.rmtree(_ckpt(run_dir))
    return "checkpoints does not exist"


def _empty_folder(run_dir):
    shutil.rmtree(_ckpt(run_dir))
    os.mkdir(_ckpt(run_dir))
    return "checkpoints is empty"


def _write_cut_short(run_dir):  # what a SIGKILL during the only save leaves
    os.rename(_ckpt(run_dir, STEP), _ckpt(run_dir, f".tmp-{STEP}"))
    os.remove(_ckpt(run_dir, f".tmp-{STEP}", "manifest.json"))
    return f"holds only a write cut short, .tmp-{STEP}"


def _manifest_missing(run_dir):  # the issue's own case
    os.remove(_manifest(run_dir))
    return f"{STEP} is damaged: it has no manifest.json"


def _manifest_not_json(run_dir):
    with open(_manifest(run_dir), "r+") as fh:
        fh.truncate(40)  # cut short mid-record
    return f"{STEP} is damaged: manifest.json"


def _manifest_of_another_step(run_dir):
    _rewrite_manifest(run_dir, lambda record: record.update(step=1))
    return f"{STEP} is damaged: manifest.json is of step 1, not 2"


def _manifest_names_a_missing_file(run_dir):
    _rewrite_manifest(run_dir, lambda record: record["files"].update({"actor/extra.pt": 10}))
    return f"{STEP} is damaged: actor/extra.pt is missing or has the wrong size"


def _file_missing(run_dir):
    os.remove(_ckpt(run_dir, STEP, "trainer_state.json"))
    return f"{STEP} is damaged: trainer_state.json is missing or has the wrong size"


def _file_changed(run_dir):
    path = _ckpt(run_dir, STEP, "actor", "dcp", "__0_0.distcp")
    data = bytearray(open(path, "rb").read())
    data[len(data) // 2] ^= 0xFF  # same size, other bytes
    open(path, "wb").write(bytes(data))
    return f"{STEP} is damaged: actor/dcp/__0_0.distcp does not match its sha256"


def _newer_partial_step(run_dir):  # copied in part: never silently passed over for step 2
    partial = _ckpt(run_dir, "step_000003")
    shutil.copytree(_ckpt(run_dir, STEP, "actor"), os.path.join(partial, "actor"))
    return "step_000003 is damaged: it has no manifest.json"


DAMAGE = [_no_folder, _empty_folder, _write_cut_short, _manifest_missing, _manifest_not_json,
          _manifest_of_another_step, _manifest_names_a_missing_file, _file_missing,
          _file_changed, _newer_partial_step]
MODES = {"train": ("trainer.steps=3",),
         "val_only": ("trainer.val_only=true", "trainer.val_every=1")}


@pytest.mark.parametrize("mode", sorted(MODES))
@pytest.mark.parametrize("damage", DAMAGE, ids=[d.__name__.strip("_") for d in DAMAGE])
def test_a_resume_with_no_usable_checkpoint_is_refused_and_changes_nothing(
        finished_run, damage, mode, tmp_path, capsys):
    run_dir = str(tmp_path / "run")
    shutil.copytree(finished_run, run_dir)
    said = damage(run_dir)
    before = _snapshot(run_dir)
    capsys.readouterr()
    code = main(["run", graph_file("grpo"), "--resume", run_dir, *SMALL, *MODES[mode]])
    out, err = capsys.readouterr()
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 1, err
    assert len(lines) == 1 and lines[0].startswith(f"hybridflow run: --resume {run_dir}: "), err
    assert said in lines[0], lines[0]
    assert "nothing in the run directory was changed" in lines[0]
    assert "Traceback" not in err and "starting at step 0" not in err + out
    assert _snapshot(run_dir) == before


def test_the_issue_case_names_the_history_it_keeps(finished_run, tmp_path, capsys):
    """No checkpoint at all: the refusal says what the run has written and what to do."""
    run_dir = str(tmp_path / "run")
    shutil.copytree(finished_run, run_dir)
    _no_folder(run_dir)
    capsys.readouterr()
    code = main(["run", graph_file("grpo"), "--resume", run_dir, *SMALL,
                 "trainer.val_only=true", "trainer.val_every=1"])
    err = capsys.readouterr().err
    assert code == 1
    assert ("but the run has written metrics.jsonl, timeline.jsonl, status.json at step 2, "
            "which a start at step 0 would overwrite") in err
    assert "start a new run (without --resume)" in err


@pytest.mark.parametrize("damage", DAMAGE, ids=[d.__name__.strip("_") for d in DAMAGE])
def test_check_refuses_the_resume_run_refuses_with_its_words(finished_run, damage, tmp_path,
                                                             capsys):
    """`check` is `run` without the workers: `check --resume` finds the run, merges its
    own config and verifies the newest checkpoint as `run --resume` does, writing
    nothing, and refuses with `run`'s line."""
    run_dir = str(tmp_path / "run")
    shutil.copytree(finished_run, run_dir)
    said = damage(run_dir)
    before = _snapshot(run_dir)
    capsys.readouterr()
    code = main(["check", graph_file("grpo"), "--resume", run_dir, *SMALL, "trainer.steps=3"])
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 1, err
    assert len(lines) == 1 and lines[0].startswith(f"hybridflow check: --resume {run_dir}: ")
    assert said in lines[0], lines[0]
    assert _snapshot(run_dir) == before


def test_check_of_a_usable_resume_names_the_checkpoint_and_the_run_config(
        finished_run, tmp_path, capsys):
    run_dir = str(tmp_path / "run")
    shutil.copytree(finished_run, run_dir)
    before = _snapshot(run_dir)
    capsys.readouterr()
    # the run's own config (data.batch_size=4 from SMALL) is what is checked: not passed here
    code = main(["check", graph_file("grpo"), "--resume", run_dir, "trainer.steps=3"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert f"note: --resume: {run_dir} resumes from " in out and STEP in out
    assert "ok" in out.splitlines()[-1]
    assert _snapshot(run_dir) == before
