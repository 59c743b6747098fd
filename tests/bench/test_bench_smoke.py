"""The benchmark scripts still run end to end (tiny sizes, few calls) and write their
JSON; speed is not asserted -- that is what the benchmarks themselves report."""
from __future__ import annotations

import json
import os
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, REPO)


def test_dispatch_local_core_times_every_variant_and_writes_json(tmp_path):
    from bench import dispatch
    out = tmp_path / "dispatch.json"
    payload = dispatch.run(sizes=(8, 32), calls=3, warmup=1, chain=2, with_ray=False,
                           out=str(out), quiet=True)
    kinds = {(r["variant"], r["B"], r["calls_per_step"]) for r in payload["rows"]}
    assert {("local", 8, 1), ("python", 32, 2)} <= kinds
    assert json.loads(out.read_text())["machine"]["torch_threads"] == 1
    assert "verdict" in payload["targets"]
    assert "|" in dispatch.report(payload)


@pytest.mark.ray
@pytest.mark.slow  # starts its own Ray session
def test_dispatch_ray_core_counts_driver_bytes(tmp_path):
    import ray
    from bench import dispatch
    started = not ray.is_initialized()
    try:
        payload = dispatch.run(sizes=(8,), calls=2, warmup=1, chain=2, with_ray=True,
                               out=str(tmp_path / "d.json"), quiet=True)
    finally:
        if started and ray.is_initialized():
            ray.shutdown()
    ray_rows = [r for r in payload["rows"] if r["variant"] == "ray"]
    assert ray_rows and all(r["driver_control_bytes"] > 0 for r in ray_rows)
    assert {r["variant"] for r in payload["rows"]} >= {"local", "python", "ray", "plain",
                                                       "driver"}


def test_step_core_alternates_local_and_handwritten(tmp_path):
    from bench import step
    out = tmp_path / "step.json"
    payload = step.run(steps=1, warmup=0, with_ray=False, with_trl=False,
                       with_accuracy=False, with_memory=False, out=str(out), quiet=True)
    assert set(payload["step_s"]) == {"local", "handwritten"}
    assert payload["targets"]["local_over_handwritten"] > 0
    assert "x handwritten" in step.report(payload)


def test_handwritten_grpo_step_and_greedy_accuracy():
    from bench.handwritten_grpo import HandwrittenGRPO
    loop = HandwrittenGRPO()
    metrics = loop.step()
    assert 0.0 <= metrics["score"] <= 1.0
    assert 0.0 <= loop.greedy_accuracy() <= 1.0


def test_check_bench_reports_cpu_seconds_against_the_budget(tmp_path):
    from bench import check
    out = tmp_path / "check.json"
    payload = check.run(graphs=("grpo",), reps=1, out=str(out), quiet=True)
    torch_row, row = payload["rows"]
    assert torch_row["graph"] == check.TORCH and torch_row["cpu_ratio_to_torch"] == 1.0
    assert row["graph"] == "grpo" and row["cpu_s_median"] > 0
    assert row["cpu_ratio_to_torch"] == row["cpu_s_median"] / torch_row["cpu_s_median"]
    assert payload["targets"]["worst_cpu_ratio"] == row["cpu_ratio_to_torch"]
    assert payload["targets"]["verdict"] in ("within budget", "over budget")
    assert json.loads(out.read_text())["targets"]["cpu_budget_s"] == check.CPU_BUDGET_S
    assert "budget" in check.report(payload)


def test_suite_times_sums_wall_and_cpu_seconds_per_module(tmp_path, capsys):
    from bench import suite_times
    tests = tmp_path / "t"
    tests.mkdir()
    (tests / "test_busy.py").write_text(
        "import time\n\n\ndef test_spin():\n    end = time.process_time() + 0.2\n"
        "    while time.process_time() < end:\n        pass\n\n\ndef test_two():\n"
        "    pass\n")
    (tests / "test_fails.py").write_text("def test_no():\n    assert False\n")
    out = tmp_path / "times.json"
    # its own rootdir: the modules' names (node ids) then do not depend on where the
    # checkout lies relative to the temp folder (a clone beside /tmp/pytest-of-* saw
    # "../pytest-of-root/.../test_busy.py")
    assert suite_times.main(["--rootdir", str(tests), str(tests)], out=str(out)) == 1
    payload = json.loads(out.read_text())
    busy, fails = (payload["modules"][m] for m in ("test_busy.py", "test_fails.py"))
    assert busy["tests"] == 2 and fails["tests"] == 1
    assert busy["cpu_s"] >= 0.15 and busy["wall_s"] >= 0.15  # the spin (clock ticks)
    assert payload["outcomes"] == {"passed": 2, "failed": 1}
    assert "test_busy.py" in capsys.readouterr().out
