"""bench/parallel.py still runs end to end (a tiny Llama, tp 1 vs 2, one run), raw and
through the workers (`--workers`), and writes its JSON: the weights are really sharded
(about half per rank at tp=2, the tied embedding once), both variants compute the same
loss from the same weights, the sync's receiver holds the trained weights, and every
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


@pytest.mark.slow  # two variants of spawned ranks building workers (~45 s)
@pytest.mark.skipif(not os.path.exists("/proc/self/clear_refs"), reason="needs Linux /proc")
def test_the_workers_mode_measures_each_phase_at_tp1_and_tp2(tmp_path):
    out = tmp_path / "parallel_workers.json"
    subprocess.run([sys.executable, os.path.join(REPO, "bench", "parallel.py"), "--workers",
                    "--random-init", "--hidden", "64", "--intermediate", "128", "--heads", "4",
                    "--kv-heads", "2", "--layers", "2", "--vocab", "512", "--tp", "2",
                    "--n", "2", "--new-tokens", "4", "--bucket-mb", "0.01", "--reps", "1",
                    "--out", str(out)], check=True, capture_output=True, cwd=str(tmp_path),
                   timeout=300)
    result = json.loads(out.read_text())
    summary = result["summary"]
    assert set(summary) == {"1", "2"}
    assert 0.5 <= result["weight_ratio"] < 0.55  # the actor's workers really shard
    for tp, s in summary.items():
        assert s["received_equal"], tp  # the sync's receiver holds the trained weights
        for phase in result["phases"]:
            assert s[phase]["seconds"] > 0 and s[phase]["peak_rss_bytes"] > 0, (tp, phase)
    ranks = result["runs"]["2"][0]
    assert len(ranks) == 2 and all("actor.update" in r for r in ranks)
    assert "sync.receive" in ranks[0] and "sync.receive" not in ranks[1]  # rank 0 receives
    # one update from the same weights and rows: the same loss at both layouts
    losses = [result["runs"][tp][0][0]["update_metrics"] for tp in ("1", "2")]
    assert losses[1]["actor/pg_loss"] == pytest.approx(losses[0]["actor/pg_loss"], abs=1e-5)
