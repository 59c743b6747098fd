"""The planner's calibration benches: every published point stays within the issue's
±30% with the shipped constants, and the local bench's spread over repeats is the
median and range of each node's numbers."""
from __future__ import annotations

import json
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, REPO)


def test_every_published_point_is_predicted_within_30_percent():
    from bench import planner_fit
    with open(planner_fit.POINTS) as handle:
        points = json.load(handle)["points"]
    rows = planner_fit.report(points)
    assert len(rows) == len(points) >= 7
    misses = {r["id"]: r["ratio"] for r in rows if not r["ratio"] or not 0.7 <= r["ratio"] <= 1.3}
    assert not misses, f"predicted / measured outside ±30%: {misses}"


def test_micro_batched_rollout_is_what_brings_openrlhf_70b_in():
    """Without rollout_call_sequences (one call, continuous batching) the 70B point falls
    back under the band: the term, not a constant, carries it."""
    from bench import planner_fit
    with open(planner_fit.POINTS) as handle:
        point = next(p for p in json.load(handle)["points"] if p["id"] == "openrlhf-llama2-70b")
    with_calls = planner_fit.predict(point)["predicted"]
    point["workload"]["rollout_call_sequences"] = 0
    one_call = planner_fit.predict(point)["predicted"]
    assert one_call / point["measured_step_seconds"] < 0.7 < 0.9 < with_calls / point[
        "measured_step_seconds"]


def test_local_bench_spread_is_the_median_and_range_over_repeats():
    from bench.planner_local import spread
    def repeat(measured, ratio):
        return {"micro_benchmark_only": {"step": {"measured": measured, "predicted": 0.0,
                                                  "ratio": ratio}}}
    got = spread([repeat(0.3, 1.2), repeat(0.1, 0.8), repeat(0.2, None)])
    step = got["micro_benchmark_only"]["step"]
    assert step["measured"] == {"median": 0.2, "min": 0.1, "max": 0.3, "n": 3}
    assert step["ratio"] == {"median": 1.0, "min": 0.8, "max": 1.2, "n": 2}
    assert "calibrated_on_check_run" not in got
