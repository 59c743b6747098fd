"""A Ray instance that a run starts for itself: bound to loopback, and recorded so
that the processes a killed run leaves behind can be ended by the next start.

Binding. Ray's processes (GCS, raylet, workers, the driver's own servers, the
dashboard and runtime-env agents) listen on the node's IP address, which Ray takes
to be the machine's network address even when `_node_ip_address="127.0.0.1"` is
asked for (Ray 2.60 resolves loopback back to the network address unless its
"cluster" mode is off). A run that starts its own Ray is one machine's business, so
`start_local_ray` turns that mode off while Ray starts: every Ray process of the run
then listens on 127.0.0.1 only. `runtime.listen_all=true` keeps Ray's behaviour.

Leftovers. When the driver dies by SIGKILL (or the OOM killer), Ray's GCS and
raylet follow it, but the dashboard and runtime-env agents (children of the raylet)
do not. Nothing can run in a SIGKILLed process, so each run that starts Ray writes a
record (its pid and the pids and start times of Ray's processes) to
`RECORDS_DIR/<pid>.json`; the next run that starts Ray (a `--resume` too) ends the
processes of records whose driver is gone and says so. A record is removed when its
driver exits normally. What cannot be cleaned: leftovers of a run on another
machine, and of a run that joined an existing cluster (`--address`): that cluster
belongs to whoever started it.

Priority. Ray starts its worker processes at nice 15 (`RAY_worker_niceness`): they
get a core only when nothing at nice 0 wants it. The workers do all of a run's
compute, while the driver (nice 0) mostly waits on them; on a machine with anything
else running (another job, a second test process, the run's own driver polling)
the workers starved: two actors took 55 s to start beside two busy processes on 2
cores instead of 3 s (bench/ray_priority.py, docs/benchmarks.md). So a Ray the run
starts for itself runs its workers at nice 0, as the driver; `RAY_worker_niceness`
set in the environment wins. A cluster joined with `--address` keeps its own setting.

State: the record files under RECORDS_DIR (one per live or dead driver) and
`os.environ` during `start_local_ray`.
"""
from __future__ import annotations

import atexit
import contextlib
import json
import os
import signal
import tempfile
import time

__all__ = ["RECORDS_DIR", "start_local_ray", "clean_leftovers", "record_session",
           "workers_at_driver_priority"]

RECORDS_DIR = os.environ.get("HYBRIDFLOW_RAY_RECORDS",
                             os.path.join(tempfile.gettempdir(), "hybridflow-ray-sessions"))
_CLUSTER_MODE_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"  # Ray's switch, see module doc
NICENESS_ENV = "RAY_worker_niceness"  # read by the raylet as it starts; see module doc


def start_local_ray(listen_all: bool, start_timeout_s: float = 300.0, **init_kwargs) -> None:
    """`ray.init(address="local", **init_kwargs)` for this run alone: a Ray of its own,
    never one already running on the machine (nor RAY_ADDRESS's); on loopback unless
    `listen_all`; within `start_timeout_s`, its processes ended if it fails
    (start_bound.py). Leftovers of killed earlier runs are ended first, and this one
    is recorded."""
    from hybridflow.runtime.ray.start_bound import bounded_start
    cleaned = clean_leftovers()
    if cleaned:
        from hybridflow.core.printable import echo
        echo(f"hybridflow: ended {len(cleaned)} Ray process(es) left running by killed "
             f"earlier runs: {', '.join(cleaned)}")
    with bounded_start(start_timeout_s), workers_at_driver_priority():
        if listen_all:
            import ray
            ray.init(address="local", **init_kwargs)
        else:
            _init_on_loopback(**init_kwargs)
    record_session()


@contextlib.contextmanager
def workers_at_driver_priority():
    """While Ray starts: its workers at nice 0 unless `RAY_worker_niceness` is set."""
    if NICENESS_ENV in os.environ:  # the user's choice
        yield
        return
    os.environ[NICENESS_ENV] = "0"
    try:
        yield
    finally:
        os.environ.pop(NICENESS_ENV, None)


def _init_on_loopback(**init_kwargs) -> None:
    import ray
    from ray._private import ray_constants
    saved_env, saved_mode = os.environ.get(_CLUSTER_MODE_ENV), ray_constants.ENABLE_RAY_CLUSTER
    os.environ[_CLUSTER_MODE_ENV] = "0"       # Ray's processes started now read it
    ray_constants.ENABLE_RAY_CLUSTER = False  # this process read it when Ray was imported
    try:
        ray.init(address="local", _node_ip_address="127.0.0.1", **init_kwargs)
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = saved_mode
        if saved_env is None:
            os.environ.pop(_CLUSTER_MODE_ENV, None)
        else:
            os.environ[_CLUSTER_MODE_ENV] = saved_env


def record_session(wait_s: float = 5.0) -> str:
    """Write this driver's record: the pids and start times of its Ray processes (the
    agents start a moment after ray.init returns: wait up to `wait_s` for them)."""
    import psutil
    me = psutil.Process()
    deadline = time.monotonic() + wait_s
    while True:
        children = me.children(recursive=True)
        agents = [p for p in children if _name(p).endswith("Agent")]
        if not children or len(agents) >= 2 or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    record = {"driver": me.pid, "driver_started": me.create_time(),
              "processes": [{"pid": p.pid, "started": _started(p), "name": _name(p)}
                            for p in children]}
    os.makedirs(RECORDS_DIR, exist_ok=True)
    path = os.path.join(RECORDS_DIR, f"{me.pid}.json")
    with open(path, "w") as fh:
        json.dump(record, fh)
    atexit.register(_remove, path)
    return path


def clean_leftovers(records_dir: str | None = None) -> list[str]:
    """End the recorded Ray processes of drivers that are gone; returns
    'name (pid N)' for each process ended. Records of live drivers are kept."""
    import psutil
    folder = records_dir or RECORDS_DIR
    if not os.path.isdir(folder):
        return []
    ended = []
    for entry in sorted(os.listdir(folder)):
        path = os.path.join(folder, entry)
        try:
            with open(path) as fh:
                record = json.load(fh)
        except (OSError, ValueError):
            _remove(path)
            continue
        if _alive(record["driver"], record["driver_started"]):
            continue
        for proc in record["processes"]:
            if _alive(proc["pid"], proc["started"]):
                _end(psutil.Process(proc["pid"]))
                ended.append(f"{proc['name']} (pid {proc['pid']})")
        _remove(path)
    return ended


def _alive(pid: int, started: float) -> bool:
    """The same process (pid and start time) still runs: a reused pid is not it."""
    import psutil
    try:
        proc = psutil.Process(pid)
        return abs(proc.create_time() - started) < 1.0 and proc.status() != "zombie"
    except psutil.Error:
        return False


def _end(proc) -> None:
    import psutil
    try:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=3)
    except psutil.TimeoutExpired:
        try:
            proc.kill()
            proc.wait(timeout=5)  # ended, not only signalled, when this returns
        except psutil.Error:
            pass
    except psutil.Error:
        pass


def _name(proc) -> str:
    try:
        return proc.name()
    except Exception:  # noqa: BLE001 - gone while we looked
        return "?"


def _started(proc) -> float:
    try:
        return proc.create_time()
    except Exception:  # noqa: BLE001
        return 0.0


def _remove(path: str) -> None:
    try:
        os.remove(path)
    except OSError:
        pass
