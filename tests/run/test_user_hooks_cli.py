"""Issue 26 classes 4 and 5, swept over every kind of user hook: a reward scorer, an
environment's constructor, `reset` and `step`, and a function node (which runs in the
worker shell, as worker methods do) that hangs, calls `sys.exit`, raises
`KeyboardInterrupt` or another BaseException. Each runs `hybridflow run` in a
subprocess with a wall-clock limit and asserts that the process ENDS within a bound,
fails (exit 1, status `failed`, never `interrupted`), names the hook on a short
stderr (no asyncio flood), and, for a hang, says which bound stopped it. (An
environment failing in `step` ends only the episodes that stepped, which are counted;
the run fails when every episode failed, as docs/agents.md says.)"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HOOKS = '''
import sys
import time

from graphs.envs import calculator


class Custom(BaseException):
    pass


def misbehave(kind):
    if kind == "hang":
        time.sleep(100000)
    if kind == "exit":
        sys.exit(3)
    if kind == "interrupt":
        raise KeyboardInterrupt
    if kind == "base":
        raise Custom("odd")


def scorer(kind):
    def compute_score(data_source, solution_str, ground_truth, extra_info=None):
        misbehave(kind)
        return 0.0
    return compute_score


class Env:
    def __init__(self, where, kind):
        self.inner, self.where, self.kind = calculator.make_env(), where, kind
        if where == "init":
            misbehave(kind)

    def reset(self, row):
        if self.where == "reset":
            misbehave(self.kind)
        return self.inner.reset(row)

    def step(self, turn):
        if self.where == "step":
            misbehave(self.kind)
        return self.inner.step(turn)


KIND = "{kind}"
compute_score = scorer(KIND)


def make_env_init():
    return Env("init", KIND)


def make_env_reset():
    return Env("reset", KIND)


def make_env_step():
    return Env("step", KIND)
'''

FN_GRAPH = '''
from hybridflow import Batch, node_fn
from graphs.grpo import ALGORITHM, defaults, build as grpo_build
import hooks


@node_fn(reads=("scores",), writes=("probe",), rows=True)
def probe(batch):
    hooks.misbehave(hooks.KIND)
    return Batch({{"probe": batch["scores"].float()}})


def build(cfg):
    g = grpo_build(cfg)
    g.fn(probe, "reward.score", monitor=True)
    return g
'''

SMALL = ["trainer.steps=1", "trainer.val_every=0", "trainer.progress=false",
         "data.batch_size=2", "rollout.n=2", "actor.mini_batch_size=4",
         "runtime.call_timeout_s=6", "reward.timeout_s=1"]
HOOK_NAMES = {"scorer": "compute_score", "env_init": "Env", "env_reset": "reset",
              "env_step": "step", "fn_node": "probe"}
KINDS = ("hang", "exit", "interrupt", "base")
LIMIT_S = 150  # the process must end long before this


def _command(hook: str, tmp_path) -> list[str]:
    hooks = tmp_path / "hooks.py"
    args = [f"trainer.runs_dir={tmp_path / 'runs'}", *SMALL]
    if hook == "scorer":
        graph = os.path.join(REPO, "graphs", "grpo.py")
        args += [f"reward.function_path={hooks}"]
    elif hook == "fn_node":
        graph = str(tmp_path / "g.py")
        (tmp_path / "g.py").write_text(textwrap.dedent(FN_GRAPH.format()))
    else:
        graph = os.path.join(REPO, "graphs", "agent_grpo.py")
        args += [f"agent.env={hooks}:make_{hook}", "agent.step_timeout_s=2"]
    return [sys.executable, "-m", "hybridflow", "run", graph, *args]


@pytest.mark.slow  # a subprocess run each (~10-20 s)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("hook", sorted(HOOK_NAMES))
def test_a_misbehaving_hook_fails_the_run_and_the_process_ends(hook, kind, tmp_path):
    (tmp_path / "hooks.py").write_text(textwrap.dedent(HOOKS).replace("{kind}", kind))
    env = {**os.environ, "PYTHONPATH": REPO, "PYTHONUNBUFFERED": "1"}
    start = time.monotonic()
    proc = subprocess.run(_command(hook, tmp_path), capture_output=True, text=True,
                          timeout=LIMIT_S, env=env, cwd=str(tmp_path))
    took = time.monotonic() - start
    err = proc.stderr
    lines = [line for line in err.splitlines() if line.strip()
             and not line.startswith(("Loading weights", "20"))]  # HF's bar, Ray's log
    assert "Task exception was never retrieved" not in err
    assert len(lines) <= 8, "\n".join(lines)
    status_files = [os.path.join(root, "status.json")
                    for root, _, files in os.walk(tmp_path / "runs") if "status.json" in files]
    if hook == "env_step" and proc.returncode == 0:
        # episodes whose model turn was cut before a stop token never step: the
        # environment failed on some episodes only, which end counted (agents.md)
        metrics = [json.loads(x) for x in open(os.path.join(os.path.dirname(
            status_files[0]), "metrics.jsonl"))]
        key = "agent/env_timeouts_total" if kind == "hang" else "agent/env_errors_total"
        assert metrics[-1][key] > 0, metrics[-1]
        assert json.load(open(status_files[0]))["state"] == "finished"
        assert took < LIMIT_S - 30, took
        return
    assert proc.returncode == 1, (proc.returncode, err[-3000:])
    message = next(line for line in lines if line.startswith("hybridflow run:"))
    if hook == "env_init":  # pre-flight builds one environment: refused before launch
        assert not status_files and message.startswith("hybridflow run: agent.env:"), message
    else:
        status = json.load(open(status_files[0]))
        assert status["state"] == "failed", status
        assert "signal" not in status or status["signal"] is None
    if hook.startswith("env"):
        assert "environment" in message and "make_" + hook in message, message
    if hook == "scorer":
        assert "reward" in message, message
    if hook == "fn_node":
        assert "probe" in message, message
    if kind == "hang":
        bound = {"scorer": "reward.timeout_s", "fn_node": "runtime.call_timeout_s",
                 "env_init": "agent.step_timeout_s=2s"}.get(hook, "took longer than 2s")
        assert bound in message, message
    elif kind in ("exit", "interrupt"):
        done = "sys.exit(3)" if kind == "exit" else "KeyboardInterrupt"
        assert done in message and "hooks.py" in message, message
    assert took < LIMIT_S - 30, took
