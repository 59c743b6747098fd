"""A Ray start (hybridflow/runtime/ray/start_bound.py, session.py) that fails ends the
run and every process it started: a start timeout forced tiny, a raylet killed while
the driver waits in `ray.init` (named, at once, not at the timeout), one SIGTERM
during `ray.init`. And a run without --address starts a Ray of its own while another
is running on the machine (named by RAY_ADDRESS too), never joining it. Each drives
a real `hybridflow run` (or driver) in a subprocess and watches its process tree
with psutil."""
from __future__ import annotations

import atexit
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import psutil
import pytest

from tests.support.ports import free_port

pytestmark = [pytest.mark.ray, pytest.mark.slow]  # Ray starts (~10-30 s each)
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RUN = ["-m", "hybridflow", "run", os.path.join(REPO, "graphs", "grpo.py"), "--runtime", "ray",
       "trainer.steps=1", "trainer.progress=false", "trainer.val_every=0",
       "trainer.run_name=run"]


def _short_dir() -> str:
    """A short folder (Ray's socket paths must stay under 107 bytes), removed at exit."""
    path = tempfile.mkdtemp(prefix="hfr-")
    atexit.register(shutil.rmtree, path, True)
    return path


def _env(tmp_path) -> dict:
    # a Ray temp folder of the test's own: a Ray killed here leaves its
    # ray_current_cluster file behind, which a later ray.init() of this test process
    # would take for a cluster to join
    env = {**os.environ, "HYBRIDFLOW_RAY_RECORDS": str(tmp_path / "records"),
           "PYTHONPATH": REPO, "RAY_TMPDIR": _short_dir()}
    env.pop("RAY_ADDRESS", None)
    return env


class Tree:
    """Every descendant of a process seen while it ran (pid, start time, name)."""

    def __init__(self, proc: subprocess.Popen):
        self.root, self.seen = psutil.Process(proc.pid), {}

    def look(self) -> list[str]:
        try:
            children = self.root.children(recursive=True)
        except psutil.Error:
            return []
        names = []
        for child in children:
            try:
                self.seen.setdefault(child.pid, (child.create_time(), child.name()))
                names.append(child.name())
            except psutil.Error:
                continue
        return names

    def still_running(self) -> list[str]:
        left = []
        for pid, (started, name) in self.seen.items():
            try:
                proc = psutil.Process(pid)
                if abs(proc.create_time() - started) < 1 and proc.status() != "zombie":
                    left.append(f"{name} (pid {pid})")
            except psutil.Error:
                continue
        return left


def _drive(tmp_path, *overrides, on_child=None, limit_s: float = 240.0):
    """Run `hybridflow run` to its end, calling `on_child(proc, names)` as its tree
    grows; returns (exit code, stderr, the tree)."""
    proc = subprocess.Popen([sys.executable, *RUN, f"trainer.runs_dir={tmp_path}", *overrides],
                            env=_env(tmp_path), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    tree, end = Tree(proc), time.monotonic() + limit_s
    try:
        while proc.poll() is None and time.monotonic() < end:
            names = tree.look()
            if on_child is not None and names:
                on_child(proc, names)
            time.sleep(0.05)
        assert proc.poll() is not None, "the driver did not end"
    finally:
        if proc.poll() is None:
            proc.kill()
        stderr = proc.stderr.read()
        proc.wait()
    time.sleep(1.0)  # a process that was SIGTERMed at the driver's end is gone by now
    return proc.returncode, stderr, tree


def _status(tmp_path) -> dict:
    with open(tmp_path / "run" / "status.json") as fh:
        return json.load(fh)


def test_a_start_that_times_out_ends_with_nothing_left_running(tmp_path):
    code, err, tree = _drive(tmp_path, "runtime.start_timeout_s=1")
    assert code == 1, err
    # the bound trips in ray.init, or (Ray up within the second) in the workers' start
    assert "Ray did not start within runtime.start_timeout_s=1s" in err or \
        "took more than 1s (runtime.start_timeout_s)" in err, err
    assert "Traceback" not in err and "\x1b" not in err
    assert tree.seen, "Ray started no process: nothing was tested"
    assert tree.still_running() == []
    assert _status(tmp_path)["state"] == "failed"


def test_a_raylet_killed_during_ray_init_ends_the_run_and_all_of_ray(tmp_path):
    killed = []

    def kill_raylet(proc, names):
        if not killed:
            for child in psutil.Process(proc.pid).children(recursive=True):
                if child.name() == "raylet":
                    child.kill()
                    killed.append(child.pid)
    # a start timeout far beyond the test's: the death itself must end the start
    code, err, tree = _drive(tmp_path, "runtime.start_timeout_s=600", on_child=kill_raylet,
                             limit_s=120)
    assert killed, "no raylet was seen"
    assert code != 0, err
    assert f"Ray's raylet (pid {killed[0]}) died while ray.init waited" in err, err
    assert "Traceback" not in err
    assert tree.still_running() == []
    assert _status(tmp_path)["state"] in ("failed", "interrupted")


def test_one_sigterm_during_ray_init_stops_the_run_and_all_of_ray(tmp_path):
    sent = []

    def terminate(proc, names):
        if not sent and "gcs_server" in names:
            proc.send_signal(signal.SIGTERM)
            sent.append(time.monotonic())
    code, err, tree = _drive(tmp_path, "runtime.start_timeout_s=120", on_child=terminate)
    assert sent, "no gcs_server was seen"
    assert code == 128 + signal.SIGTERM, err
    assert "SIGTERM" in err and "Traceback" not in err
    assert tree.still_running() == []
    assert _status(tmp_path)["state"] == "interrupted"


OWN_RAY = """
import ray
from hybridflow.runtime.ray.session import start_local_ray
start_local_ray(False, 120, num_cpus=1, num_gpus=0, include_dashboard=False)
print(ray.get_runtime_context().gcs_address, flush=True)
ray.shutdown()
"""


def test_without_address_a_run_starts_its_own_ray_beside_another(tmp_path):
    """Another job's Ray, started with `ray start --head` and named by RAY_ADDRESS (what
    `ray.init()` without an address would join)."""
    port = free_port()
    ray_cli = os.path.join(os.path.dirname(sys.executable), "ray")
    head = subprocess.Popen([ray_cli, "start", "--head", "--block", f"--port={port}",
                             "--node-ip-address=127.0.0.1", "--num-cpus=1",
                             "--include-dashboard=false"],
                            env=_env(tmp_path), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    other = Tree(head)
    try:
        deadline = time.monotonic() + 120
        while "raylet" not in other.look() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert "raylet" in other.look(), "the other Ray did not start"
        env = {**_env(tmp_path), "RAY_ADDRESS": f"127.0.0.1:{port}"}
        out = subprocess.run([sys.executable, "-c", OWN_RAY], env=env, capture_output=True,
                             text=True, timeout=240)
        assert out.returncode == 0, out.stderr[-2000:]
        own = out.stdout.strip().splitlines()[-1]
        assert own != f"127.0.0.1:{port}", "joined the other Ray"
        assert "num_cpus and num_gpus must not be provided" not in out.stderr
        assert head.poll() is None  # the other Ray was left alone
    finally:  # the other Ray's processes, by pid (never `ray stop`: it ends every Ray)
        other.look()
        procs = [other.root]
        for pid in other.seen:
            try:
                procs.append(psutil.Process(pid))
            except psutil.Error:
                pass
        for proc in procs:
            try:
                proc.kill()
            except psutil.Error:
                pass
        head.wait(timeout=30)
        psutil.wait_procs(procs, timeout=15)

