"""bench/workload.py gives realistic shapes; bench/memory.py measures and predicts a
configuration end to end; bench/gpu.py parses its arguments and refuses to run
without CUDA. No speed or accuracy targets are asserted here."""
from __future__ import annotations

import json
import os
import sys

import pytest
import torch

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, REPO)


def test_workload_lengths_have_a_long_tail_within_bounds():
    from bench import workload
    lengths = workload.response_lengths(4096, max_response=256)
    assert lengths.min() >= 16 and lengths.max() == 256
    assert lengths.float().mean() > lengths.float().median()  # skewed right
    assert 0 < (lengths == 256).float().mean() < 0.1          # a few run into the cap


def test_workload_rollout_has_the_generate_layout():
    from bench import workload
    batch = workload.make_rollout(prompts=4, n=2, max_response=64, max_prompt=16)
    assert batch["input_ids"].shape == (8, 80) and batch["responses"].shape == (8, 64)
    lengths = batch["response_length"]
    assert torch.equal(batch["response_mask"].sum(-1), lengths)
    ended = lengths < 64  # every row that ended early ends with EOS
    last = batch["responses"][torch.arange(8), lengths - 1]
    assert torch.all(last[ended] == workload.EOS_ID)
    assert list(batch.non_tensors["uid"]) == ["0", "0", "1", "1", "2", "2", "3", "3"]


def test_workload_model_sizes_are_in_the_promised_range():
    from bench import workload
    from hybridflow.memory import model_size
    from transformers import AutoConfig
    for name in workload.SIZES:
        values = workload.hf_config(name)
        size = model_size(AutoConfig.for_model(values.pop("model_type"), **values))
        assert 5e6 <= size.params <= 30e6, name


def test_memory_bench_predicts_and_measures_one_configuration(tmp_path):
    from bench import memory
    out = tmp_path / "memory.json"
    case = memory.Case("update", "5m", rows=4, micro=2, prompt=16, response=32)
    payload = memory.run((case,), out=str(out), quiet=True)
    row = payload["rows"][0]
    assert row["measured_bytes"] > 0 and row["predicted_bytes"] > 0
    assert {"weights", "optimizer", "gradients", "activations", "logits"} <= \
        set(row["breakdown"])
    assert json.loads(out.read_text())["rows"][0]["name"] == case.name
    assert "| update 5m" in memory.report(payload)


def test_gpu_bench_parses_and_needs_cuda(capsys):
    from bench import gpu
    with pytest.raises(SystemExit) as info:
        gpu.parse_args(["--help"])
    assert info.value.code == 0
    args = gpu.parse_args(["--prompts", "8", "--max-response", "64"])
    assert (args.prompts, args.max_response) == (8, 64)
    if not torch.cuda.is_available():
        assert gpu.main(["--prompts", "8"]) == 2
        assert "needs a CUDA device" in capsys.readouterr().err


def test_engine_overrides_put_a_shipped_graph_on_the_workload_model():
    from bench import workload
    from hybridflow.program.assemble import prepare
    loaded = prepare(os.path.join(REPO, "graphs", "grpo.py"),
                     workload.engine_overrides("5m", prompts=16, n=4), preflight=False)
    assert loaded.cfg.model.path is None
    assert loaded.cfg.model.hf_config.hidden_size == workload.SIZES["5m"][0]
    assert (loaded.cfg.data.batch_size, loaded.cfg.rollout.n) == (16, 4)


@pytest.mark.parametrize("extra", [[], ["--max-tokens", "0"], ["--packed"]])
def test_gpu_bench_passes_run_on_the_cpu(extra):
    """The GPU script's log-prob and update passes (token budget, rows, packed) run
    here on a small model, so the script is known to work before a GPU is lent."""
    from bench import gpu, workload
    args = gpu.parse_args(["--micro", "4", "--max-tokens", "256", *extra])
    model = workload.make_model("5m")
    if args.packed:
        from hybridflow.workers.varlen_attention import use_varlen_attention
        use_varlen_attention(model)
    batch = workload.make_rollout(2, 4, max_response=32, max_prompt=16)
    logp = gpu.logprob_pass(model, batch, args, "cpu")
    assert logp.shape == batch["responses"].shape and torch.isfinite(logp).all()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    before = [p.detach().clone() for p in model.parameters()]
    gpu.update_step(model, optimizer, batch, args, "cpu")
    assert any(not torch.equal(a, p) for a, p in zip(before, model.parameters()))
