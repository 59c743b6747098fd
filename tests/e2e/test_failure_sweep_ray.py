"""On Ray, a failure inside a worker reaches the user as it does locally
(test_failure_sweep_local.py): one console line naming the node, role and rank and
the root cause's `Type: message` (none of Ray's colour codes or wrapper text), the
traceback in error.log, status.json final."""
from __future__ import annotations

import json
import textwrap

import pytest

from hybridflow.cli import main
from tests.support.e2e import graph_file

pytestmark = [pytest.mark.ray, pytest.mark.slow]  # one Ray run (~40 s)


def test_a_worker_failure_on_ray_is_one_line_and_a_final_status(capsys, tmp_path):
    scorer = tmp_path / "scorer.py"
    scorer.write_text(textwrap.dedent("""
        def compute_score(data_source, solution_str, ground_truth, extra_info=None):
            raise LookupError("\\x1b[31mno answer key\\x1b[0m for this row\\nsecond line")
    """))
    code = main(["run", graph_file("grpo"), "--runtime", "ray", f"trainer.runs_dir={tmp_path}",
                 "trainer.run_name=run", "trainer.steps=1", "trainer.val_every=0",
                 "trainer.progress=false", "data.batch_size=4", "rollout.n=2",
                 "actor.mini_batch_size=8", f"reward.function_path={scorer}"])
    err = capsys.readouterr().err
    assert code == 1
    assert "\x1b" not in err and "Traceback" not in err and "ray::" not in err, err
    lines = [line for line in err.splitlines() if line.startswith("hybridflow run:")]
    assert len(lines) == 1, err
    assert "node 'reward.score'" in lines[0] and "role 'reward' rank 0" in lines[0], lines[0]
    assert "no answer key for this row" in lines[0], lines[0]
    with open(tmp_path / "run" / "status.json") as fh:
        status = json.load(fh)
    assert status["state"] == "failed" and status["reason"] in lines[0]
    assert "Traceback" in (tmp_path / "run" / "error.log").read_text()
