"""bench/async.py still runs end to end (tiny sizes, Ray): every variant steps, the
async ones at the staleness asked for, and the JSON holds the fields the docs quote.
Speed is not asserted -- that is what the benchmark reports."""
from __future__ import annotations

import importlib
import json
import os
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, REPO)

pytestmark = [pytest.mark.ray, pytest.mark.slow]  # a Ray session, four trainers (~50 s)

TINY = ["--reps", "1", "--steps", "4", "--fixed-steps", "3", "--warmup", "1",
        "--val-every", "2", "--staleness", "0", "1", "--prompts", "2", "--n", "4",
        "--max-new-tokens", "4", "--extra", "actor.mini_batch_size=8", "--quiet"]


def test_async_bench_writes_ratios_staleness_and_busy_fractions(tmp_path):
    bench = importlib.import_module("bench.async")  # `async` is a keyword: no plain import
    out = tmp_path / "async.json"
    bench.run(bench.parse([*TINY, "--out", str(out)]))
    payload = json.loads(out.read_text())

    assert payload["setup"]["off_policy"] in ("tis", "uncorrected")
    rows = {row["staleness"]: row for row in payload["rows"]}
    assert sorted(rows) == [0, 1]
    assert rows[0]["staleness_max"] == 0 and rows[1]["staleness_max"] == 1
    fixed = {row["staleness"]: row for row in payload["fixed_policy"]["rows"]}
    assert fixed[1]["staleness_max"] == 1 and fixed[1]["step_reached"] is None  # no validation
    for row in [*rows.values(), *fixed.values()]:
        assert row["steps_per_s"] > 0
        assert 0 < row["busy_gen"] <= 1 and 0 < row["busy_main"] <= 1
        assert row["gen_pool_s"] > 0 and row["main_pool_s"] > 0
        assert row["cpu_share_gen"] > 0 and row["driver_cpu_s"] > 0
    rep = payload["reps"][0]["1"]
    assert [step for step, _ in rep["accuracy"]] == [0, 2, 4]  # validated every 2 steps
    ratio = payload["ratios"]["1"]
    assert len(ratio["steps_per_s"]) == 1 and ratio["steps_per_s_median"] > 0
    assert set(payload["targets"]) == {"steps_per_s_k1", "time_to_accuracy_k1",
                                       "steps_per_s_k1_fixed_policy"}
    assert "fixed policy (actor.lr=0)" in bench.report(payload)
