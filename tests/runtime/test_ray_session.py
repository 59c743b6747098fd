"""The Ray session of a run (hybridflow/runtime/ray/pools.py connect, ray_session.py):
an unreachable --address fails fast naming what was tried; a Ray the run starts
listens on loopback only, its workers at the driver's priority; processes a
SIGKILLed driver left are ended by the next start. One Ray session for the module,
started by `connect` itself."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from hybridflow.plan.placement import Placement, PoolSpec
from hybridflow.runtime.ray.pools import RayConnectError, RuntimeSettings, connect
from hybridflow.runtime.ray.session import (NICENESS_ENV, clean_leftovers,
                                            workers_at_driver_priority)

pytestmark = [pytest.mark.ray, pytest.mark.slow]  # Ray sessions (~30 s)
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ONE_DEVICE = Placement({"main": PoolSpec("main", 1, 1)}, {})


@pytest.mark.timeout(120)  # Ray's own retries would go on for minutes
def test_an_unreachable_address_fails_fast_and_says_what_it_tried():
    import ray
    assert not ray.is_initialized()
    with pytest.raises(RayConnectError) as info:
        connect(RuntimeSettings(address="127.0.0.1:1", connect_timeout_s=2), ONE_DEVICE)
    assert "runtime.address='127.0.0.1:1'" in str(info.value)
    assert "runtime.connect_timeout_s=2s" in str(info.value)


def _listening(pids) -> list[tuple[str, str]]:
    found = []
    for pid in pids:
        try:
            proc = psutil.Process(pid)
            for conn in proc.net_connections(kind="inet"):
                if conn.status == psutil.CONN_LISTEN:
                    found.append((proc.name(), conn.laddr.ip))
        except psutil.Error:
            continue
    return found


def test_a_ray_the_run_starts_listens_on_loopback_only_with_workers_at_nice_0(
        tmp_path, monkeypatch):
    import ray
    monkeypatch.setattr("hybridflow.runtime.ray.session.RECORDS_DIR", str(tmp_path))
    monkeypatch.delenv(NICENESS_ENV, raising=False)
    assert connect(RuntimeSettings(num_cpus=2), ONE_DEVICE)
    try:
        # a worker process too, at the driver's priority (Ray's default is nice 15)
        assert ray.get(ray.remote(lambda: os.nice(0)).remote()) == os.nice(0)
        assert NICENESS_ENV not in os.environ  # set only while Ray started
        me = psutil.Process()
        pids = [me.pid, *(p.pid for p in me.children(recursive=True))]
        sockets = _listening(pids)
        names = {name for name, _ in sockets}
        assert {"gcs_server", "raylet"} <= names, sockets
        assert all(ip in ("127.0.0.1", "::ffff:127.0.0.1", "::1") for _, ip in sockets), sockets
        assert len(os.listdir(tmp_path)) == 1  # this driver's record
    finally:
        ray.shutdown()


def test_a_worker_niceness_the_user_set_is_kept(monkeypatch):
    monkeypatch.setenv(NICENESS_ENV, "7")
    with workers_at_driver_priority():
        assert os.environ[NICENESS_ENV] == "7"
    assert os.environ[NICENESS_ENV] == "7"


def _still_running(proc: dict) -> bool:
    try:
        found = psutil.Process(proc["pid"])
        return found.create_time() == proc["started"] and found.status() != "zombie"
    except psutil.Error:
        return False


DRIVER = """
import sys, time
from hybridflow.plan.placement import Placement, PoolSpec
from hybridflow.runtime.ray.pools import RuntimeSettings, connect
connect(RuntimeSettings(num_cpus=1), Placement({"main": PoolSpec("main", 1, 1)}, {}))
print("ready", flush=True)
time.sleep(600)
"""


def test_processes_a_killed_driver_left_are_ended_by_the_next_start(tmp_path):
    env = {**os.environ, "HYBRIDFLOW_RAY_RECORDS": str(tmp_path), "PYTHONPATH": REPO}
    driver = subprocess.Popen([sys.executable, "-c", DRIVER], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, text=True)
    try:
        assert driver.stdout.readline().strip() == "ready"
        with open(tmp_path / f"{driver.pid}.json") as fh:
            recorded = json.load(fh)["processes"]
    finally:
        driver.send_signal(signal.SIGKILL)
        driver.wait()
    time.sleep(3)  # what dies with the driver has died
    ended = clean_leftovers(str(tmp_path))
    assert any("Agent" in name for name in ended), ended  # the agents outlive a SIGKILL
    for proc in recorded:
        assert not _still_running(proc), proc
    assert os.listdir(tmp_path) == []
