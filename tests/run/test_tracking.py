"""Metric sinks: metrics.jsonl always; W&B offline through its public API."""
import json
import os
import sys
import types

import pytest

from hybridflow.run.tracking import MetricSinks, RunDir, read_jsonl


def test_wandb_sink_logs_offline_with_the_step(tmp_path, monkeypatch):
    calls = {}
    fake = types.ModuleType("wandb")
    def log(data, step):
        calls.setdefault("log", []).append((data, step))

    run = types.SimpleNamespace(log=log, finish=lambda: calls.setdefault("finished", True))
    fake.init = lambda **kw: calls.setdefault("init", kw) and run
    monkeypatch.setitem(sys.modules, "wandb", fake)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    sinks = MetricSinks(RunDir(str(tmp_path)), wandb=True, name="r")
    sinks.log(3, {"actor/pg_loss": 0.5, "note": "text"})
    sinks.close()
    assert os.environ["WANDB_MODE"] == "offline"
    assert calls["init"]["dir"] == str(tmp_path)
    assert calls["log"] == [({"actor/pg_loss": 0.5}, 3)]
    assert calls["finished"]
    line = json.loads(open(tmp_path / "metrics.jsonl").read())
    assert line == {"step": 3, "actor/pg_loss": 0.5, "note": "text"}


def test_missing_tracking_package_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # import fails
    with pytest.raises(RuntimeError, match=r"trainer.wandb=true needs the 'wandb' package"):
        MetricSinks(RunDir(str(tmp_path)), wandb=True)


def test_a_torn_last_metrics_line_is_trimmed_with_a_note(tmp_path):
    """What a crash or a full disk leaves: the last line cut short. Resume drops it
    (and says so) instead of failing on the JSON."""
    run = RunDir(str(tmp_path))
    with open(run.file("metrics.jsonl"), "w") as fh:
        fh.write('{"step": 1, "a": 1.0}\n{"step": 2, "a": 2.0}\n{"step": 3, "a": 3.')
    assert [m["step"] for m in run.read_metrics()] == [1, 2]
    notes = run.truncate_metrics(2)
    assert len(notes) == 1 and "metrics.jsonl:3: dropped a torn last line" in notes[0]
    assert open(run.file("metrics.jsonl")).read() == (
        '{"step": 1, "a": 1.0}\n{"step": 2, "a": 2.0}\n')


def test_a_bad_line_before_the_last_is_an_error_naming_the_line(tmp_path):
    from hybridflow.core.loading import UserFileError
    run = RunDir(str(tmp_path))
    with open(run.file("metrics.jsonl"), "w") as fh:
        fh.write('{"step": 1}\n{"step": 2,,}\n{"step": 3}\n')
    with pytest.raises(UserFileError, match=r"metrics.jsonl' line 2 is not valid JSON"):
        run.truncate_metrics(3)


def test_a_status_write_on_a_full_disk_leaves_the_old_status_and_no_temporary(
        tmp_path, monkeypatch):
    import errno
    run = RunDir(str(tmp_path))
    run.set_status("running", step=3)

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(OSError, match="No space left"):
        run.set_status("failed", step=3)
    assert run.status()["state"] == "running" and run.status()["step"] == 3
    assert sorted(os.listdir(tmp_path)) == ["status.json"]


def test_status_names_the_writing_process(tmp_path):
    import socket
    run = RunDir(str(tmp_path))
    run.set_status("running", step=7)
    status = run.status()
    assert status["pid"] == os.getpid() and status["host"] == socket.gethostname()
    assert status["step"] == 7


def test_new_run_dirs_never_share_a_directory(tmp_path):
    from hybridflow.run.tracking import new_run_dir
    first = new_run_dir(str(tmp_path), "g", "exp")
    second = new_run_dir(str(tmp_path), "g", "exp")
    assert first.path != second.path and second.path.endswith("exp-2")


def test_a_resume_moves_the_lines_of_steps_it_redoes_aside_never_drops_them(tmp_path):
    """Append only: the lines after the checkpoint go to metrics.superseded.jsonl (and
    timeline's to timeline.superseded.jsonl); None (a validation-only look) keeps all."""
    run = RunDir(str(tmp_path))
    for name in ("metrics.jsonl", "timeline.jsonl"):
        with open(run.file(name), "w") as fh:
            fh.write("".join(f'{{"step": {s}}}\n' for s in (1, 2, 3, 4)))
    before = open(run.file("metrics.jsonl")).read()
    assert run.truncate_metrics(None) == []  # nothing to change: not written
    assert open(run.file("metrics.jsonl")).read() == before
    notes = run.truncate_metrics(2)
    assert any("metrics.jsonl: moved the 2 line(s) of step(s) 3-4" in n for n in notes)
    for name in ("metrics", "timeline"):
        assert [m["step"] for m in read_jsonl(run.file(f"{name}.jsonl"))[0]] == [1, 2]
        assert [m["step"] for m in read_jsonl(run.file(f"{name}.superseded.jsonl"))[0]] == [3, 4]


def test_a_config_written_again_unchanged_keeps_its_file(tmp_path):
    from omegaconf import OmegaConf
    run = RunDir(str(tmp_path))
    run.save_config(OmegaConf.create({"trainer": {"steps": 2}}))
    stat = os.stat(run.file("config.yaml"))
    run.save_config(OmegaConf.create({"trainer": {"steps": 2}}))
    assert os.stat(run.file("config.yaml")).st_ino == stat.st_ino  # not replaced
