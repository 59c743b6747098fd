"""bench/async.py still runs end to end (tiny sizes, Ray, pools pinned to their own
cores where two are free): every variant steps, the async ones at the staleness asked
for, and the JSON holds the fields the docs quote (busy fractions, driver and sample
bytes, the overlap bound and each variant's fraction of it). Speed is not asserted --
that is what the benchmark reports."""
from __future__ import annotations

import importlib
import json
import os
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, REPO)

pytestmark = [pytest.mark.ray, pytest.mark.slow]  # a Ray session, three trainers (~60 s)

TINY = ["--reps", "1", "--steps", "4", "--fixed-steps", "0", "--warmup", "1",
        "--val-every", "2", "--staleness", "0", "1", "--streaming", "2", "--prompts", "2",
        "--n", "4", "--max-new-tokens", "4", "--extra", "actor.mini_batch_size=8", "--quiet"]


def test_async_bench_writes_ratios_staleness_and_busy_fractions(tmp_path):
    bench = importlib.import_module("bench.async")  # `async` is a keyword: no plain import
    out = tmp_path / "async.json"
    bench.run(bench.parse([*TINY, "--out", str(out)]))
    payload = json.loads(out.read_text())

    assert payload["setup"]["off_policy"] in ("tis", "uncorrected")
    rows = {row["staleness"]: row for row in payload["rows"]}
    assert sorted(rows, key=str) == [0, 1, "s2"]
    assert [rows[k]["staleness_max"] for k in (0, 1, "s2")] == [0, 1, 2]
    assert payload["fixed_policy"] is None  # --fixed-steps 0: the learning phase only
    for row in rows.values():
        assert row["steps_per_s"] > 0
        assert 0 < row["busy_gen"] <= 1 and 0 < row["busy_main"] <= 1
        assert row["cpu_share_gen"] > 0 and row["driver_cpu_s"] > 0
        assert row["driver_bytes"] > 0
    # the samples: 2 prompts x 4 rows, prompt + response ids and masks at least
    assert rows[0]["sample_bytes"] > 8 * 4 * 8
    assert all(rows[k]["sample_bytes"] == rows[0]["sample_bytes"] for k in rows)
    rep = payload["reps"][0]["1"]
    assert [step for step, _ in rep["accuracy"]] == [0, 2, 4]  # validated every 2 steps
    sync = payload["reps"][0]["0"]
    for k in ("1", "s2"):
        ratio = payload["ratios"][k]
        assert len(ratio["steps_per_s"]) == 1 and ratio["steps_per_s_median"] > 0
        bound = 1 / max(sync["busy_gen"], sync["busy_main"])
        assert ratio["overlap_bound"] == [pytest.approx(bound)]
        assert ratio["of_bound"] == [pytest.approx(ratio["steps_per_s"][0] / bound)]
    assert set(payload["targets"]) == {
        "steps_per_s_k1", "time_to_accuracy_k1",
        "streaming_k2_of_overlap_bound", "steps_per_s_streaming_k2_over_k1",
        "driver_bytes_share_0", "driver_bytes_share_1", "driver_bytes_share_s2"}
    if len(os.sched_getaffinity(0)) >= 2:
        assert payload["setup"]["pinned_cores"] == dict(zip(
            ("main", "gen"), sorted(os.sched_getaffinity(0))[:2]))
    text = bench.report(payload)
    assert "streaming 2 / staleness 1" in text and "% of it" in text
