"""Failures during a run on the local runtime: NaN rewards or losses and a worker
that raises stop the run with one line naming node and step; status.json records
why (with the traceback); the last good checkpoint is intact and loads."""
from __future__ import annotations

import json
import os
import re
import shutil
import textwrap

import pytest

from hybridflow.checkpoint import latest_checkpoint, load_trainer_state
from hybridflow.cli import main
from tests.support.e2e import REPO, graph_file

# 8 rows a step (4 prompts x 2 samples); no validation, so the scorer sees train rows only
SMALL = ("trainer.val_every=0", "data.batch_size=4", "rollout.n=2", "actor.mini_batch_size=8",
         "actor.micro_batch_size=8", "trainer.save_every=1", "trainer.progress=false")


def run(capsys, tmp_path, *overrides, graph="grpo") -> tuple[int, str, dict, str]:
    """`hybridflow run` into tmp_path/run; exit code, stderr, status.json, run dir."""
    path = graph if os.path.isfile(graph) else graph_file(graph)
    code = main(["run", path, f"trainer.runs_dir={tmp_path}", "trainer.run_name=run",
                 *SMALL, *overrides])
    err = capsys.readouterr().err
    run_dir = str(tmp_path / "run")
    with open(os.path.join(run_dir, "status.json")) as fh:
        return code, err, json.load(fh), run_dir


def scorer(tmp_path, body: str) -> str:
    """A scorer that answers 1.0 for its first 16 rows (two steps), then runs `body`."""
    path = tmp_path / "scorer.py"
    path.write_text(textwrap.dedent(f"""
        import math
        calls = 0
        def compute_score(data_source, solution_str, ground_truth, extra_info=None):
            global calls
            calls += 1
            if calls <= 16:
                return 1.0
            {body}
    """))
    return str(path)


def test_nan_reward_stops_the_run_naming_node_and_step_and_keeps_the_checkpoint(
        capsys, tmp_path):
    code, err, status, run_dir = run(capsys, tmp_path, "trainer.steps=5",
                                     f"reward.function_path={scorer(tmp_path, 'return math.nan')}")
    assert code == 1
    assert "hybridflow run: stopped at step 3: node 'reward.score'" in err
    assert "failed on role 'reward' rank 0: ScoringError: reward scorer returned nan" in err
    assert "Traceback" not in err
    assert status["state"] == "failed" and status["step"] == 3
    assert status["node"] == "reward.score" and status["rank"] == 0
    assert "returned nan" in status["reason"] and "Traceback" in status["traceback"]
    last = latest_checkpoint(os.path.join(run_dir, "checkpoints"))
    assert last.endswith("step_000002")
    state, _ = load_trainer_state(last)
    assert state["step"] == 2
    assert [m["step"] for m in _metrics(run_dir) if m["step"] > 0] == [1, 2]


def test_a_scorer_that_raises_is_reported_with_node_role_and_rank(capsys, tmp_path):
    path = scorer(tmp_path, 'raise ValueError("cannot parse " + solution_str[:5])')
    code, err, status, _ = run(capsys, tmp_path, "trainer.steps=4", f"reward.function_path={path}")
    assert code == 1
    assert "stopped at step 3: node 'reward.score'" in err
    assert "reward scorer failed on row 0" in err and "ValueError: cannot parse" in err
    lines = [line for line in err.splitlines() if line.strip() and "Loading weights" not in line]
    assert len(lines) == 2 and "Traceback" not in err  # one line, and where to look
    assert lines[1].startswith("(details: ") and lines[1].endswith("status.json)")
    assert status["state"] == "failed" and status["error"] == "NodeFailure"


NAN_LOSS_GRAPH = '''
import torch
from graphs.grpo import defaults
from hybridflow import Batch, Graph, node_fn

calls = 0


@node_fn(reads=("scores", "uid", "response_mask"), writes=("advantages",), group_by="uid")
def advantages_nan_from_step_2(batch):
    global calls
    calls += 1
    value = float("nan") if calls >= 2 else 0.5
    return Batch({"advantages": torch.full(batch["response_mask"].shape, value)})


def build(cfg):
    g = Graph("nan_loss")
    prompts = g.source("prompts")
    rollout = g.call("actor.generate", prompts, n=cfg.rollout.n)
    old = g.call("actor.logprob", rollout)
    ref = g.call("ref.logprob", rollout)
    score = g.call("reward.score", rollout)
    adv = g.fn(advantages_nan_from_step_2, rollout, score)
    g.call("actor.update", rollout, old, ref, adv)
    return g
'''


def test_nan_loss_stops_the_run_naming_node_and_step(capsys, tmp_path):
    graph = tmp_path / "nan_loss.py"
    graph.write_text(NAN_LOSS_GRAPH)
    code, err, status, run_dir = run(capsys, tmp_path, "trainer.steps=4", graph=str(graph))
    assert code == 1
    assert re.search(r"stopped at step 2: node 'actor.update' produced "
                     r"actor/(pg_loss|grad_norm)=nan; the run stops and the last good "
                     r"checkpoint is kept", err), err
    assert status["state"] == "failed" and status["error"] == "NumericsError"
    assert latest_checkpoint(os.path.join(run_dir, "checkpoints")).endswith("step_000001")


def test_a_worker_that_fails_to_start_is_one_line_and_recorded(capsys, tmp_path):
    model = tmp_path / "model"
    shutil.copytree(os.path.join(REPO, "graphs", "assets", "toy_base"), model)
    (model / "model.safetensors").write_bytes(b"not safetensors")
    code, err, status, _ = run(capsys, tmp_path, "trainer.steps=2", f"model.path={model}",
                               f"model.tokenizer={model}")
    assert code == 1
    assert err.startswith("hybridflow run: could not start: ")
    assert "Traceback" not in err
    assert status["state"] == "failed" and status["step"] == 0


def _metrics(run_dir: str) -> list[dict]:
    with open(os.path.join(run_dir, "metrics.jsonl")) as fh:
        return [json.loads(line) for line in fh if line.strip()]


def test_a_nan_score_from_a_reward_model_is_caught_by_the_finite_check():
    """A reward model (no rule scorer to refuse NaN) reports its mean score as a
    metric; the step loop's finite check stops on it, naming node and step."""
    from hybridflow.loop import NumericsError, check_finite
    with pytest.raises(NumericsError, match=r"step 4: node 'reward.score' produced "
                                            r"critic/score/mean=nan"):
        check_finite(4, {"actor.generate": {"response_length/mean": 3.0},
                         "reward.score": {"critic/score/mean": float("nan")}})
    check_finite(4, {"reward.score": {"critic/score/mean": 0.5}})
