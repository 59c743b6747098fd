"""bench/gpu.py --tp: refused without CUDA (and for a tp that does not divide the heads)
before anything starts; its CPU path (`--device cpu`: the same torchrun ranks on gloo)
runs end to end on a tiny model, tp 1 vs 2, and measures every phase. The GPU run itself
has not run (no GPU here)."""
import json
import os
import subprocess
import sys

import pytest
import torch

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TINY = {"hidden_size": 64, "num_hidden_layers": 2, "intermediate_size": 128,
        "vocab_size": 512, "num_attention_heads": 4, "num_key_value_heads": 2}


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal without CUDA")
def test_tp_needs_cuda_or_the_cpu_device(capsys):
    from bench import gpu
    assert gpu.main(["--tp", "2"]) == 2
    assert "--device cpu" in capsys.readouterr().err


def test_a_tp_that_does_not_divide_the_heads_is_refused(capsys):
    from bench import gpu
    assert gpu.main(["--tp", "3", "--device", "cpu", "--shapes", json.dumps(TINY)]) == 2
    assert "4 heads are not divisible" in capsys.readouterr().err


@pytest.mark.slow  # two torchrun launches of ranks building workers (~50 s)
@pytest.mark.skipif(not os.path.exists("/proc/self/clear_refs"), reason="needs Linux /proc")
def test_the_cpu_path_measures_each_phase_at_tp1_and_tp2(tmp_path):
    out = tmp_path / "gpu_tp.json"
    subprocess.run([sys.executable, os.path.join(REPO, "bench", "gpu.py"), "--tp", "2",
                    "--device", "cpu", "--reps", "1", "--n", "2", "--new-tokens", "4",
                    "--prompt-copies", "1", "--bucket-mb", "0.01", "--shapes", json.dumps(TINY),
                    "--out", str(out)], check=True, capture_output=True, cwd=str(tmp_path),
                   timeout=300)
    result = json.loads(out.read_text())
    summary = result["summary"]
    assert set(summary) == {"1", "2"}
    for tp, s in summary.items():
        assert s["received_equal"], tp
        for phase in result["phases"]:
            assert s[phase]["seconds"] > 0 and s[phase]["peak_rss_bytes"] > 0, (tp, phase)
    assert 0.5 <= summary["2"]["weight_bytes_per_rank"] / summary["1"][
        "weight_bytes_per_rank"] < 0.55  # torchrun's two ranks really shard
    assert [r["rank"] for r in result["runs"]["2"][0]] == [0, 1]
