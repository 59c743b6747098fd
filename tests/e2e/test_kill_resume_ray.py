"""A worker process killed mid-run on Ray: the run stops with a message naming node,
role and rank, the last checkpoint stays intact, and `--resume` finishes the run."""
import glob
import json
import os

import pytest

from hybridflow.cli import main
from tests.support.e2e import graph_file

pytestmark = [pytest.mark.ray, pytest.mark.slow,  # a run killed and resumed on Ray (~25 s)
              pytest.mark.usefixtures("ray_session")]

SCORER = '''
import os
from algorithms.rewards.toy import compute_score as toy_score

COUNT = {count!r}
KILLED = {killed!r}


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    n = int(open(COUNT).read()) + 1 if os.path.exists(COUNT) else 1
    open(COUNT, "w").write(str(n))
    if n == {kill_at} and not os.path.exists(KILLED):
        open(KILLED, "w").write("yes")
        os._exit(1)  # the whole worker process dies, as on an OOM kill
    return toy_score(data_source, solution_str, ground_truth, extra_info)
'''


def test_killed_worker_stops_the_run_and_resume_finishes_it(tmp_path, capsys):
    rows_per_step = 4 * 2
    scorer = tmp_path / "scorer.py"
    scorer.write_text(SCORER.format(count=str(tmp_path / "count"), killed=str(tmp_path / "killed"),
                                    kill_at=rows_per_step * 3 + 1))  # during step 4
    args = [graph_file("grpo"), "--runtime", "ray", f"trainer.runs_dir={tmp_path}/runs",
            "trainer.run_name=killed", "trainer.steps=4", "trainer.save_every=2",
            "trainer.val_every=0", "trainer.progress=false", "data.batch_size=4", "rollout.n=2",
            "actor.micro_batch_size=8",
            "actor.mini_batch_size=8", f"reward.function_path={scorer}",
            "runtime.call_timeout_s=60"]
    assert main(["run", *args]) == 1
    run_dir = os.path.join(tmp_path, "runs", "killed")
    status = json.load(open(os.path.join(run_dir, "status.json")))
    assert status["state"] == "failed" and status["step"] == 4
    assert "reward.score" in status["reason"] and "reward" in status["reason"]
    assert "rank 0" in status["reason"]
    assert sorted(os.path.basename(p) for p in glob.glob(f"{run_dir}/checkpoints/step_*")) \
        == ["step_000002"]

    assert main(["run", graph_file("grpo"), "--resume", run_dir, "--runtime", "ray"]) == 0
    status = json.load(open(os.path.join(run_dir, "status.json")))
    assert status["state"] == "finished" and status["step"] == 4
    steps = [json.loads(line)["step"] for line in open(os.path.join(run_dir, "metrics.jsonl"))]
    assert steps == [1, 2, 3, 4]  # step 3 ran before the kill and again after it: once here
