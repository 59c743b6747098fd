"""Class: a run that cannot make progress stops and says why (issue 32, class 1).

Every kind of wait a step has -- a gather's rounds, the pipelined buffer (a gather on
the rollout side), the streaming buffer's entrance filter, agent episodes streamed --
is fed a filter that drops every row: the run stops within its bound of draws, with
one line naming the filter and what it dropped, exit 1 and `failed` in status.json
(never a hang, never a "finished" run that trained on 0 rows). And a signal during a
step that cannot end stops the run within `trainer.stop_timeout_s`, naming the last
completed step.
"""
from __future__ import annotations

import json
import os
import re
import textwrap

import pytest

from hybridflow.cli import main

SMALL = ("trainer.val_every=0", "data.batch_size=4", "rollout.n=2", "actor.mini_batch_size=8",
         "actor.micro_batch_size=8", "trainer.progress=false", "trainer.steps=2",
         "actor.use_kl_loss=false")
ASYNC = ("trainer.staleness=1", "actor.off_policy=decoupled")

# the generate call and what feeds the filter, per kind of rollout
GRAPH = """
from hybridflow import Graph, node_fn
from graphs import ops
from graphs.{base} import defaults  # noqa: F401 (the base graph's model and task)


@node_fn(reads=("uid",), forwards=True)
def drop_every_group(batch):
    return batch.take([])


def build(cfg):
    g = Graph("drop_all")
    rollout = g.call("{call}", g.source("prompts"), n=cfg.rollout.n)
    inputs = [rollout{score}]
    kept = g.fn(drop_every_group, *inputs)
    batch = g.gather(kept, until=cfg.data.batch_size * cfg.rollout.n, max_rounds=2)
    old = g.call("actor.logprob", batch)
    adv = g.fn(ops.grpo_advantages, batch)
    g.call("actor.update", batch, old, adv, loss=ops.policy_loss(cfg.actor))
    return g
"""
ROLLOUTS = {"generate": dict(base="grpo", call="rollout.generate",
                             score=', g.call("reward.score", rollout)'),
            "agent": dict(base="agent_grpo", call="agent.play", score="")}
WAITS = {  # kind of wait -> (rollout, overrides)
    "gather_rounds": ("generate", ()),
    "pipelined_buffer": ("generate", ASYNC),
    "streaming_buffer": ("generate", (*ASYNC, "trainer.async_mode=streaming")),
    "agent_episodes": ("agent", ()),
    "agent_episodes_streaming": ("agent", (*ASYNC, "trainer.async_mode=streaming")),
}


def _run(capsys, tmp_path, graph: str, *overrides) -> tuple[int, str, dict]:
    code = main(["run", graph, f"trainer.runs_dir={tmp_path}", "trainer.run_name=run",
                 *SMALL, *overrides])
    err = capsys.readouterr().err
    with open(os.path.join(tmp_path, "run", "status.json")) as fh:
        return code, err, json.load(fh)


@pytest.mark.parametrize("wait", [pytest.param(w, marks=() if w == "gather_rounds"
                                               else pytest.mark.slow) for w in WAITS])
def test_every_wait_fed_a_filter_that_drops_everything_stops_naming_it(capsys, tmp_path,
                                                                       wait):
    rollout, overrides = WAITS[wait]
    graph = tmp_path / "drop_all.py"
    graph.write_text(GRAPH.format(**ROLLOUTS[rollout]))
    code, err, status = _run(capsys, tmp_path, str(graph), *overrides)
    assert code == 1, err
    line = next(x for x in err.splitlines() if x.startswith("hybridflow run:"))
    assert line.startswith("hybridflow run: stopped at step 1: no trainable row: the "
                           "filter node 'drop_every_group' (drop_all.py:"), line
    # what it dropped, over how many draws, and the bound (1 batch + max_rounds=2)
    dropped = re.search(r"dropped (\d+) of the (\d+) (rows|groups) drawn for this step, "
                        r"in (\d+) draw\(s\) \(the bound: max_rounds=2", line)
    assert dropped, line
    per_draw = 4 * 2 if dropped[3] == "rows" else 4
    assert dropped[1] == dropped[2] and int(dropped[1]) >= 3 * per_draw
    assert int(dropped[4]) >= 3  # streaming: the draws in flight too
    assert status["state"] == "failed" and status["node"] in ("gather", "drop_every_group")
    assert "Traceback" not in err


def test_a_training_node_fed_zero_rows_without_a_gather_is_an_error(capsys, tmp_path):
    """No gather bounds it: the pass's rows say the update got none, naming the node
    that emptied them (an update on no rows would change nothing and log nothing)."""
    graph = tmp_path / "drop_all.py"
    text = GRAPH.format(**ROLLOUTS["generate"]).replace(
        "g.gather(kept, until=cfg.data.batch_size * cfg.rollout.n, max_rounds=2)", "kept")
    graph.write_text(text)
    code, err, status = _run(capsys, tmp_path, str(graph))
    assert code == 1, err
    assert re.search(r"stopped at step 1: node 'actor.update' \(drop_all.py:\d+\) would "
                     r"train on 0 rows: node 'drop_every_group' \(drop_all.py:\d+\) returned "
                     r"0 of its 8 input rows", err), err
    assert status["state"] == "failed" and status["node"] == "actor.update"


HANG = """
import os, signal, time
from hybridflow import Graph, node_fn
from graphs import ops
from graphs.grpo import defaults  # noqa: F401

calls = 0


@node_fn(reads=("uid",), forwards=True)
def hang_in_step_2(batch):
    global calls
    calls += 1
    if calls == 2:  # step 2 cannot end: a signal arrives, the step goes on waiting
        os.kill(os.getpid(), signal.SIGTERM)
        while True:
            time.sleep(0.05)
    return batch


def build(cfg):
    g = Graph("hang")
    rollout = g.call("rollout.generate", g.source("prompts"), n=cfg.rollout.n)
    score = g.call("reward.score", rollout)
    kept = g.fn(hang_in_step_2, rollout, score)
    old = g.call("actor.logprob", kept)
    adv = g.fn(ops.grpo_advantages, kept)
    g.call("actor.update", kept, old, adv, loss=ops.policy_loss(cfg.actor))
    return g
"""


def test_a_signal_during_a_step_that_cannot_end_stops_within_the_bound(capsys, tmp_path):
    graph = tmp_path / "hang.py"
    graph.write_text(textwrap.dedent(HANG))
    code, err, status = _run(capsys, tmp_path, str(graph), "trainer.steps=4",
                             "trainer.save_every=1", "trainer.stop_timeout_s=1")
    assert code == 143, err
    assert "SIGTERM: stopping after this step, with a checkpoint (at once if the step has " \
           "not ended within trainer.stop_timeout_s=1s)" in err
    assert "SIGTERM: the step did not end within trainer.stop_timeout_s=1s; stopping at " \
           "once" in err
    saved = os.path.join(tmp_path, "run", "checkpoints", "step_000001")
    assert (f"hybridflow run: SIGTERM: stopped at step 1; step 2 did not finish "
            f"(checkpoint {saved})") in err
    assert status["state"] == "interrupted" and status["step"] == 1
    assert status["checkpoint"] == saved
    assert "Traceback" not in err


@pytest.mark.ray
@pytest.mark.slow  # a Ray session and two short runs on it
@pytest.mark.parametrize("wait", ["gather_rounds", "streaming_buffer"])
def test_on_ray_the_waits_stop_naming_the_filter_too(capsys, tmp_path, ray_session, wait):
    rollout, overrides = WAITS[wait]
    graph = tmp_path / "drop_all.py"
    graph.write_text(GRAPH.format(**ROLLOUTS[rollout]))
    code, err, status = _run(capsys, tmp_path, str(graph), *overrides, "runtime.name=ray")
    assert code == 1, err
    assert "hybridflow run: stopped at step 1: no trainable row: the filter node " \
           "'drop_every_group' (drop_all.py:" in err
    assert status["state"] == "failed"
