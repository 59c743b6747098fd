"""bench/generate_speed.py runs end to end on the toy model (tiny sizes, one round)
and writes its JSON: both paths generate, each against the peak measured beside it.
Rates are what the benchmark reports; only their sanity is asserted."""
from __future__ import annotations

import json
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, REPO)


def test_generate_speed_bench_times_both_paths_against_the_peak(tmp_path):
    from bench import generate_speed
    out = tmp_path / "generate_speed.json"
    assert generate_speed.main(["--prompts", "2", "--n", "2", "--new-tokens", "3",
                                "--reps", "1", "--warmup", "0", "--threads", "1",
                                "--prepacked", "--out", str(out)]) == 0
    res = json.loads(out.read_text())
    assert res["peak_gflops"] > 0 and res["machine"]["torch_threads"] == 1
    assert res["prepacked_speedup"] > 0
    for name in ("hf_generate", "engine", "prepacked"):
        variant = res["variants"][name]
        (rep,) = variant["reps"]
        assert 0 < rep["generated"] <= 2 * 2 * 3 and rep["flops"] > 0
        assert variant["s"] > 0 and variant["x_bound"] > 0 and variant["gflops"] > 0
    assert res["speedup"] > 0
