"""bench/parallel.py still runs end to end (a tiny Llama, tp 1 vs 2, one run) and writes
its JSON: the weights are really sharded (about half per rank at tp=2, the tied
embedding once), both variants compute the same loss from the same weights, and every
figure is measured. The seconds and RSS are what the bench reports, not asserted."""
import json
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.slow  # three spawned ranks, each importing transformers (~20 s)
@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="needs Linux /proc")
def test_the_parallel_bench_measures_tp1_and_tp2(tmp_path):
    out = tmp_path / "parallel.json"
    subprocess.run([sys.executable, os.path.join(REPO, "bench", "parallel.py"),
                    "--hidden", "64", "--intermediate", "128", "--heads", "4",
                    "--kv-heads", "2", "--layers", "2", "--vocab", "512", "--tp", "2",
                    "--batch", "2", "--seq", "16", "--reps", "1", "--out", str(out)],
                   check=True, capture_output=True, cwd=str(tmp_path), timeout=120)
    result = json.loads(out.read_text())
    summary = result["summary"]
    assert set(summary) == {"1", "2"}
    assert all(s["tied"] for s in summary.values())
    # norms stay whole on every rank: a little over half
    assert 0.5 <= result["weight_ratio"] < 0.55
    assert summary["2"]["loss"] == pytest.approx(summary["1"]["loss"], abs=1e-5)
    assert len(result["runs"]["2"][0]) == 2  # one record per rank
    for s in summary.values():
        assert s["logprob_s"] > 0 and s["train_step_s"] > 0 and s["rss_bytes_per_rank"] > 0
