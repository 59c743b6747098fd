"""bench/weight_sync.py still runs end to end (a tiny model, one run) and writes its
JSON; the peaks and seconds are what the bench reports, not asserted here beyond
their being measured for both variants and both sides."""
import json
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.slow  # four child processes, each importing transformers (~30 s)
@pytest.mark.skipif(not os.path.exists("/proc/self/clear_refs"), reason="needs Linux /proc")
def test_the_weight_sync_bench_measures_both_variants_and_sides(tmp_path):
    out = tmp_path / "ws.json"
    subprocess.run([sys.executable, os.path.join(REPO, "bench", "weight_sync.py"),
                    "--hidden", "64", "--layers", "1", "--vocab", "100", "--bucket-mb", "0.01",
                    "--reps", "1", "--out", str(out)], check=True, capture_output=True,
                   cwd=str(tmp_path))
    summary = json.loads(out.read_text())["summary"]
    assert set(summary) == {f"{v}/{side}/first" for v in ("flat", "bucketed")
                            for side in ("sender", "receiver", "sync")}
    assert all(v["seconds"] > 0 for v in summary.values())
    assert summary["flat/sync/first"]["x_flat"] == 1  # the ratio's baseline is flat's
    sync = summary["bucketed/sync/first"]["seconds"]
    assert sync == pytest.approx(summary["bucketed/sync/first"]["x_flat"]
                                 * summary["flat/sync/first"]["seconds"])
