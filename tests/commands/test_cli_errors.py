"""Every error a user can cause is one line and an exit code (hybridflow/cli.py and
commands/errors.py): file-system errors name the file or key, bad arguments name the
option, an interrupt is not a traceback, and user code calling sys.exit cannot end
the process silently."""
from __future__ import annotations

import errno
import os
import textwrap

import pytest

from hybridflow.cli import main

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GRPO = os.path.join(REPO, "graphs", "grpo.py")


def _graph(tmp_path, body: str, name: str = "g.py") -> str:
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return str(path)


def _one_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


@pytest.mark.parametrize("command", ["check", "render", "run"])
def test_build_calling_sys_exit_is_an_error_naming_the_file_line(capsys, tmp_path, command):
    path = _graph(tmp_path, """
        import sys
        from hybridflow import Graph

        def build(cfg):
            sys.exit(0)
    """)
    extra = ["-o", str(tmp_path / "g.svg")] if command == "render" else []
    code = main([command, path, f"trainer.runs_dir={tmp_path / 'runs'}", *extra])
    line = _one_line(capsys.readouterr().err)
    assert code == 1
    assert line == (f"hybridflow {command}: build() at {path}:6 called sys.exit(0); user code "
                    f"must raise an exception to stop a run, not end the process")


def test_a_graph_file_exiting_on_import_or_in_defaults_is_reported(capsys, tmp_path):
    path = _graph(tmp_path, """
        import sys
        def defaults():
            raise SystemExit("no defaults today")
        def build(cfg):
            return None
    """)
    assert main(["check", path]) == 1
    line = _one_line(capsys.readouterr().err)
    assert f"defaults() at {path}:4 called sys.exit('no defaults today')" in line
    path = _graph(tmp_path, "import sys\nsys.exit(5)\n", name="exits_on_import.py")
    for _ in range(2):  # the half-imported module is not cached: the second try reports too
        assert main(["check", path]) == 1
        assert f"<module>() at {path}:2 called sys.exit(5)" in _one_line(capsys.readouterr().err)


def test_defaults_returning_the_wrong_type_names_the_file(capsys, tmp_path):
    path = _graph(tmp_path, """
        from hybridflow import Graph
        def defaults():
            return ["trainer.steps=3"]
        def build(cfg):
            return Graph("g")
    """)
    assert main(["check", path]) == 1
    assert _one_line(capsys.readouterr().err) == (
        f"hybridflow check: defaults() in {path!r} returned list; it must return a dict of "
        f"config sections (or None)")


def test_a_runs_dir_under_a_file_is_one_line_naming_the_key(capsys, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    code = main(["run", GRPO, f"trainer.runs_dir={blocker}/runs", "trainer.steps=1"])
    line = _one_line(capsys.readouterr().err)
    assert code == 1
    assert line.startswith(f"hybridflow run: trainer.runs_dir='{blocker}/runs': cannot create "
                           f"a run directory in it: Not a directory")


def test_ctrl_c_during_start_up_is_one_line_and_exit_130(capsys, tmp_path, monkeypatch):
    import hybridflow.commands.run as run_command

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(run_command, "prepare", interrupted)
    assert main(["run", GRPO, f"trainer.runs_dir={tmp_path}"]) == 130
    assert _one_line(capsys.readouterr().err) == "hybridflow run: interrupted (SIGINT)"


def test_a_file_system_error_anywhere_names_the_file(capsys, tmp_path, monkeypatch):
    """The class, not the instance: any OSError with a file name, from any command."""
    import hybridflow.commands.check as check_command

    def disk_full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device", "/data/cache.bin")

    monkeypatch.setattr(check_command, "prepare", disk_full)
    assert main(["check", GRPO]) == 1
    assert _one_line(capsys.readouterr().err) == (
        "hybridflow check: '/data/cache.bin': No space left on device")


def test_a_bug_in_hybridflow_keeps_its_traceback(tmp_path, monkeypatch):
    import hybridflow.commands.check as check_command

    def bug(*args, **kwargs):
        raise ZeroDivisionError("a bug")

    monkeypatch.setattr(check_command, "prepare", bug)
    with pytest.raises(ZeroDivisionError):
        main(["check", GRPO])


@pytest.mark.parametrize("option, value, words", [
    ("--test-fraction", "2", "argument --test-fraction: 2.0 is not between 0 and 1"),
    ("--test-fraction", "half", "argument --test-fraction: 'half' is not a number"),
    ("--max-operand", "-3", "argument --max-operand: -3 is too small"),
    ("--max-operand", "0", "argument --max-operand: 0 is too small"),
])
def test_data_argument_errors_name_the_option(capsys, tmp_path, option, value, words):
    with pytest.raises(SystemExit) as exit_:
        main(["data", "toy", "--out", str(tmp_path), option, value])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and words in err and "Traceback" not in err


def test_data_out_onto_a_file_is_one_line(capsys, tmp_path):
    target = tmp_path / "taken"
    target.write_text("")
    assert main(["data", "toy", "--out", str(target)]) == 1
    assert _one_line(capsys.readouterr().err) == (
        f"hybridflow data: --out '{target}' is a file; give a directory (it is created if "
        f"missing)")


def test_data_out_under_a_file_names_the_path(capsys, tmp_path):
    target = tmp_path / "taken"
    target.write_text("")
    assert main(["data", "toy", "--out", str(target / "sub")]) == 1
    line = _one_line(capsys.readouterr().err)
    assert line.startswith("hybridflow data: ") and str(target) in line
    assert "not a directory" in line.lower()  # checked before any row is made


def _fake_run(tmp_path) -> str:
    """A run directory with one checkpoint of role 'actor', as `hybridflow run` saves."""
    from hybridflow.run.checkpoint import save_checkpoint

    def save_roles(root):
        os.makedirs(f"{root}/actor")
        for name in ("model.safetensors", "config.json", "tokenizer.json",
                     "optim_rank0.pt", "rng_rank0.safetensors"):
            open(f"{root}/actor/{name}", "w").write(name)

    run = tmp_path / "run"
    save_checkpoint(str(run / "checkpoints"), 2, save_roles, {})
    return str(run)


def test_export_copies_the_model_not_the_training_state(capsys, tmp_path):
    out = tmp_path / "hf"
    assert main(["export", _fake_run(tmp_path), str(out)]) == 0
    assert sorted(os.listdir(out)) == ["config.json", "model.safetensors", "tokenizer.json"]


def test_export_onto_a_file_is_one_line(capsys, tmp_path):
    target = tmp_path / "taken"
    target.write_text("")
    assert main(["export", _fake_run(tmp_path), str(target)]) == 1
    assert _one_line(capsys.readouterr().err) == (
        f"hybridflow export: OUT '{target}' is a file; give a directory (it is created if "
        f"missing)")


def test_export_refuses_a_damaged_checkpoint_naming_the_file(capsys, tmp_path):
    run = _fake_run(tmp_path)
    weights = os.path.join(run, "checkpoints", "step_000002", "actor", "model.safetensors")
    open(weights, "w").write("MODEL.safetensors"[:len("model.safetensors")])
    assert main(["export", run, str(tmp_path / "hf")]) == 1
    line = _one_line(capsys.readouterr().err)
    assert "actor/model.safetensors does not match its sha256" in line


def test_a_worker_file_exiting_on_import_is_reported(capsys, tmp_path):
    worker = tmp_path / "my_worker.py"
    worker.write_text("import sys\nsys.exit(2)\n")
    assert main(["check", GRPO, f"workers.reward={worker}:Scorer"]) == 1
    assert f"<module>() at {worker}:2 called sys.exit(2)" in _one_line(capsys.readouterr().err)
