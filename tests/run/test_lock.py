"""A run directory has one owner: a live owner is named in the error, a dead one's
lock (same host, pid gone or reused) is taken over with a message."""
import json
import os
import socket
import subprocess
import sys

import pytest

from hybridflow.run.lock import RunLock, RunLockError, read_owner


def _write_lock(path, pid, host=None, proc_start=None):
    record = {"pid": pid, "host": host or socket.gethostname(), "started": 1.0e9,
              "proc_start": proc_start}
    (path / "lock.json").write_text(json.dumps(record))


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_the_lock_records_the_owner_and_is_removed_on_release(tmp_path):
    lock = RunLock(str(tmp_path))
    lock.acquire()
    owner = read_owner(str(tmp_path))
    assert owner.pid == os.getpid() and owner.host == socket.gethostname()
    lock.release()
    assert not (tmp_path / "lock.json").exists()


def test_a_live_owner_is_an_error_naming_pid_and_host(tmp_path):
    with RunLock(str(tmp_path)):
        with pytest.raises(RunLockError, match=rf"is still running \(pid {os.getpid()} on "
                                               rf"{socket.gethostname()}, since .*stop it first"):
            RunLock(str(tmp_path)).acquire()
    assert not (tmp_path / "lock.json").exists()  # the refused one removed nothing


def test_a_dead_owners_lock_is_taken_over_with_a_message(tmp_path):
    pid = _dead_pid()
    _write_lock(tmp_path, pid)
    said = []
    lock = RunLock(str(tmp_path))
    lock.acquire(say=said.append)
    assert len(said) == 1 and f"taking over a lock of pid {pid}" in said[0]
    assert "which is gone" in said[0]
    assert read_owner(str(tmp_path)).pid == os.getpid()
    lock.release()


def test_a_reused_pid_is_not_mistaken_for_the_owner(tmp_path):
    """The pid is alive, but its process started after the lock was taken."""
    _write_lock(tmp_path, os.getpid(), proc_start=1)
    said = []
    RunLock(str(tmp_path)).acquire(say=said.append)
    assert said and "taking over" in said[0]


def test_a_lock_from_another_host_is_reported_never_taken(tmp_path):
    _write_lock(tmp_path, 12345, host="node-that-is-not-here")
    with pytest.raises(RunLockError, match=r"locked by another host \(pid 12345 on "
                                           r"node-that-is-not-here.*delete .*lock.json"):
        RunLock(str(tmp_path)).acquire()
    assert read_owner(str(tmp_path)).host == "node-that-is-not-here"


def test_release_leaves_a_lock_another_process_took_over(tmp_path):
    lock = RunLock(str(tmp_path))
    lock.acquire()
    _write_lock(tmp_path, _dead_pid())  # as if another process had taken it over
    lock.release()
    assert (tmp_path / "lock.json").exists()



def test_two_takers_of_one_stale_lock_get_one_owner(tmp_path):
    """Judging a stale lock and taking it over is one step (an flock of the run
    directory): while the first taker is between the two, the second waits, then
    finds a live owner. Without that, both would remove the stale lock and own it."""
    import threading
    _write_lock(tmp_path, _dead_pid())
    judged, go_on, results = threading.Event(), threading.Event(), {}

    def slow_say(text):  # the first taker pauses after judging the lock stale
        judged.set()
        go_on.wait(5)

    def take(name, say):
        try:
            RunLock(str(tmp_path)).acquire(say=say)
            results[name] = "owner"
        except RunLockError:
            results[name] = "refused"

    first = threading.Thread(target=take, args=("first", slow_say))
    first.start()
    assert judged.wait(5)
    second = threading.Thread(target=take, args=("second", lambda text: None))
    second.start()
    second.join(1.0)  # without the guard it would take the stale lock now
    go_on.set()
    first.join(5)
    second.join(5)
    assert results == {"first": "owner", "second": "refused"}
