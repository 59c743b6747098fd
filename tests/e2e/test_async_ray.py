"""Async training on Ray with the rollout on its own pool: the same schedule as the
local runtime (same prompts, same weights version per row), a rollout-side worker
killed mid-run stops the run with node, role and rank named, and `--resume`
finishes it."""
import glob
import json
import os

import pytest

from hybridflow.cli import main
from tests.support.async_runs import SPLIT, UNCORRECTED, run_recording, worker_order
from tests.support.e2e import graph_file
from tests.support.runs import FAST

pytestmark = [pytest.mark.ray, pytest.mark.usefixtures("ray_session")]

KILLING_SCORER = '''
import os
from algorithms.rewards.toy import compute_score as toy_score


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    n = int(open({count!r}).read()) + 1 if os.path.exists({count!r}) else 1
    open({count!r}, "w").write(str(n))
    if n == {kill_at} and not os.path.exists({killed!r}):
        open({killed!r}, "w").write("yes")
        os._exit(1)  # the whole worker process dies, as on an OOM kill
    return toy_score(data_source, solution_str, ground_truth, extra_info)
'''


def test_ray_runs_the_local_schedule(tmp_path):
    args = ("trainer.steps=4", "trainer.staleness=1", *UNCORRECTED, *SPLIT, *FAST)
    trainer, on_ray = run_recording(tmp_path / "ray", *args, "runtime.name=ray")
    _, local = run_recording(tmp_path / "local", *args)
    assert {s: (v[0], v[1]) for s, v in on_ray.items()} == \
        {s: (v[0], v[1]) for s, v in local.items()}
    assert {s: set(v[1]) for s, v in on_ray.items()} == {1: {0}, 2: {0}, 3: {1}, 4: {2}}
    assert on_ray[3][2]["async/staleness/max"] == 1
    assert on_ray[3][2]["timing_s/weight_sync"] > 0
    # Ray runs a caller's tasks to one actor in submission order, the train side's
    # first: the log-probs of batch 3 start before the reward of batch 4 on `main`
    order = worker_order(trainer.timelines[3], "main")
    assert order.index("actor.logprob") < order.index("reward.score"), order


@pytest.mark.slow  # a run killed and resumed on Ray (~30 s)
def test_a_killed_rollout_worker_stops_the_run_and_resume_finishes_it(tmp_path):
    rows_per_step = 4 * 2
    scorer = tmp_path / "scorer.py"
    # the scorer runs on the rollout side: call 4 scores the batch of step 4,
    # generated while step 3 trains
    scorer.write_text(KILLING_SCORER.format(count=str(tmp_path / "count"),
                                            killed=str(tmp_path / "killed"),
                                            kill_at=rows_per_step * 3 + 1))
    args = [graph_file("grpo"), "--runtime", "ray", f"trainer.runs_dir={tmp_path}/runs",
            "trainer.run_name=killed", "trainer.steps=6", "trainer.save_every=2",
            "trainer.staleness=1", *UNCORRECTED, *SPLIT,
            "trainer.val_every=0", "trainer.progress=false", "data.batch_size=4",
            "rollout.n=2", "actor.micro_batch_size=8", "actor.mini_batch_size=8",
            f"reward.function_path={scorer}", "runtime.call_timeout_s=60"]
    assert main(["run", *args]) == 1
    run_dir = os.path.join(tmp_path, "runs", "killed")
    status = json.load(open(os.path.join(run_dir, "status.json")))
    assert status["state"] == "failed" and status["step"] == 3  # step 3 ran with it
    assert "reward.score" in status["reason"] and "rank 0" in status["reason"]
    assert sorted(os.path.basename(p) for p in glob.glob(f"{run_dir}/checkpoints/step_*")) \
        == ["step_000002"]

    assert main(["run", graph_file("grpo"), "--resume", run_dir, "--runtime", "ray"]) == 0
    status = json.load(open(os.path.join(run_dir, "status.json")))
    assert status["state"] == "finished" and status["step"] == 6
    steps = [json.loads(line)["step"] for line in open(os.path.join(run_dir, "metrics.jsonl"))]
    assert steps == [1, 2, 3, 4, 5, 6]
