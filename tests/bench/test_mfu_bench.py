"""bench/mfu.py still runs end to end (tiny sizes, one round) and writes its JSON; the
rates are not asserted -- that is what the benchmark reports -- only that each phase's
MFU is a ratio in a sane range against the peak measured in the same run."""
from __future__ import annotations

import json
import os
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, REPO)


@pytest.mark.slow  # builds the toy actor at each dtype and runs its phases (~12 s)
def test_mfu_bench_measures_the_peak_and_every_phase(tmp_path):
    from bench import mfu
    out = tmp_path / "mfu.json"
    payload = mfu.run(prompts=2, n=2, new_tokens=2, reps=1, threads=1, out=str(out),
                      quiet=True)
    rows = payload["rows"]
    assert {r["phase"] for r in rows} == set(mfu.PHASES)
    assert {r["dtype"] for r in rows} == {"float32"} | (
        {"bfloat16"} if payload["native_bf16"] else set())
    assert payload["peak_flops"]["float32"] > 0 and payload["peak_flops"]["bfloat16"] > 0
    for row in rows:
        assert row["model_flops"] > 0 and 0 < row["mfu"] < 1.5, row
        assert 0 < row["worker_reported_mfu"] < 1.5, row
    assert json.loads(out.read_text())["machine"]["torch_threads"] == 1
    assert "x compute bound" in mfu.report(payload)
