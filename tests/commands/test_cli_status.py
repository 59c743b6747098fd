"""`hybridflow status RUN_DIR` (hybridflow/commands/status.py): one line that tells a
live run from one that died without a word, and says how the others ended."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

from hybridflow.cli import main
from hybridflow.run.lock import RunLock


def _run_dir(tmp_path, **status) -> str:
    (tmp_path / "config.yaml").write_text("trainer: {}\n")
    if status:
        (tmp_path / "status.json").write_text(json.dumps({"time": time.time(), **status}))
    return str(tmp_path)


def _status(capsys, path) -> str:
    assert main(["status", path]) == 0
    return capsys.readouterr().out.strip()


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_a_live_run_is_running_with_its_pid(capsys, tmp_path):
    path = _run_dir(tmp_path, state="running", step=3, steps=40, pid=os.getpid())
    with RunLock(path):
        line = _status(capsys, path)
    assert line.startswith(f"{path}: running (pid {os.getpid()} on {socket.gethostname()}")
    assert "step 3/40, last update" in line


def test_a_hung_run_shows_how_long_ago_it_last_moved(capsys, tmp_path):
    path = _run_dir(tmp_path, state="running", step=3, steps=40)
    status = json.loads((tmp_path / "status.json").read_text())
    status["time"] -= 1800
    (tmp_path / "status.json").write_text(json.dumps(status))
    with RunLock(path):
        assert "last update 30 min ago" in _status(capsys, path)


def test_a_run_that_died_without_a_word_is_named_so(capsys, tmp_path):
    pid = _dead_pid()
    path = _run_dir(tmp_path, state="running", step=5, steps=40, pid=pid,
                    host=socket.gethostname())
    (tmp_path / "lock.json").write_text(json.dumps(
        {"pid": pid, "host": socket.gethostname(), "started": time.time()}))
    line = _status(capsys, path)
    assert f"died without a word at step 5/40 (pid {pid} on {socket.gethostname()} is gone" in line
    assert f"--resume {path}" in line


def test_ended_runs_say_how(capsys, tmp_path):
    path = _run_dir(tmp_path, state="finished", step=40, steps=40)
    assert _status(capsys, path) == f"{path}: finished at step 40/40"
    path = _run_dir(tmp_path, state="failed", step=3, steps=40, reason="node 'x' failed")
    assert _status(capsys, path) == (f"{path}: failed at step 3/40: node 'x' failed "
                                     f"(details: {path}/error.log)")
    path = _run_dir(tmp_path, state="interrupted", step=3, steps=40, signal="SIGTERM",
                    checkpoint="c/step_000003")
    assert _status(capsys, path) == f"{path}: interrupted by SIGTERM at step 3/40 (c/step_000003)"


def test_a_directory_that_is_not_a_run_is_one_line(capsys, tmp_path):
    assert main(["status", str(tmp_path)]) == 1
    assert capsys.readouterr().err.strip() == (
        f"hybridflow status: {tmp_path} is not a run directory (no config.yaml)")


def test_a_run_starting_up_and_one_that_died_starting(capsys, tmp_path):
    path = _run_dir(tmp_path, state="starting", step=0, steps=40)
    with RunLock(path):
        assert _status(capsys, path).startswith(f"{path}: starting (pid {os.getpid()} on ")
    assert _status(capsys, path) == f"{path}: died during start-up without a word"
