"""`hybridflow status RUN_DIR`: how a run stands, telling a live run from a dead one.

status.json says `running` until the process records its end; after a SIGKILL (or
a lost machine) it never does. The run's lock (run_lock.py) tells the two apart on
the host that ran it: a live owner is running, a gone one died without a word.
"""
from __future__ import annotations

import argparse
import os
import time

from hybridflow.run.lock import read_owner
from hybridflow.run.tracking import RunDir, RunDirError

__all__ = ["add_parser", "run", "describe"]


def add_parser(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser("status", help="how a run stands (running, died, finished...)")
    parser.add_argument("run_dir", help="a run directory made by `hybridflow run`")
    return parser


def _ago(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f}s ago"
    return f"{seconds / 60:.0f} min ago" if seconds < 7200 else f"{seconds / 3600:.1f} h ago"


def _running(run: RunDir, status: dict, progress: str) -> str:
    owner = read_owner(run.path)
    updated = _ago(time.time() - status.get("time", time.time()))
    if owner is not None and owner.alive():
        return f"running ({owner.describe()}), {progress}, last update {updated}"
    if owner is not None and owner.alive() is None:
        return (f"running on another host ({owner.describe()}), {progress}, last update "
                f"{updated}; it cannot be checked from here")
    who = f"pid {status['pid']} on {status.get('host')}" if "pid" in status else "its process"
    return (f"died without a word at {progress} ({who} is gone; last update {updated}); "
            f"continue it with `hybridflow run GRAPH --resume {run.path}`")


def describe(run_path: str) -> str:
    """One line: the state, the step, and what to do next where there is something."""
    if not os.path.isfile(os.path.join(run_path, "config.yaml")):
        raise RunDirError(f"{run_path} is not a run directory (no config.yaml)")
    run = RunDir(run_path, create=False)
    status = run.status()
    state = status.get("state")
    steps = f"/{status['steps']}" if status.get("steps") else ""
    progress = f"step {status.get('step', 0)}{steps}"
    if state in (None, "starting"):  # datasets and workers loading
        owner = read_owner(run.path)
        if owner is not None and owner.alive() is not False:
            return f"starting ({owner.describe()})"
        return ("never started (no status.json)" if state is None else
                "died during start-up without a word")
    if state == "running":
        return _running(run, status, progress)
    if state == "failed":
        return f"failed at {progress}: {status.get('reason')} (details: {run.file('error.log')})"
    if state == "interrupted":
        saved = status.get("checkpoint") or "no checkpoint"
        return f"interrupted by {status.get('signal', 'a signal')} at {progress} ({saved})"
    return f"{state} at {progress}"


def run(args) -> int:
    print(f"{args.run_dir}: {describe(args.run_dir)}")
    return 0
