"""bench/real_model_trl.py and bench/real_model_memory.py: their settings, the TRL side's
dataset and reward, the memory bench's configurations and table. No model is run here:
both need the real model (minutes a step on 2 cores); speed and memory are what the
benchmarks themselves report."""
from __future__ import annotations

import json
import os
import sys
from types import SimpleNamespace

import pytest
import torch

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, REPO)


def _args(**kw):
    base = dict(model="/m", data="/d", prompts=8, n=4, max_new_tokens=48, mini=0, micro=0,
                threads=2, engine="hf", trl_vllm=False, dtype="fp32", overrides=[])
    return SimpleNamespace(**{**base, **kw})


def test_trl_settings_take_the_shipped_configs_batch_shape_and_lr():
    from bench import real_model_trl as rt
    s = rt.settings(_args())
    assert (s["mini"], s["micro"], s["lr"]) == (16, 8, 1e-5)  # graphs/configs/smollm2_arith
    tiny = rt.settings(_args(prompts=2, n=2))
    assert tiny["mini"] == 4 and tiny["micro"] == 4  # capped at the batch
    with pytest.raises(SystemExit, match="multiple of the mini-batch"):
        rt.settings(_args(prompts=3, n=2, mini=4))


def test_trl_engine_overrides_match_the_trl_side():
    from bench import real_model_trl as rt
    s = rt.settings(_args())
    over = rt.engine_overrides(s)
    for item in ("data.shuffle=false", "rollout.n=4", "rollout.max_new_tokens=48",
                 "actor.mini_batch_size=16", "actor.micro_batch_size=8",
                 "runtime.torch_threads=2", "data.train_files=/d/train.jsonl",
                 "model.dtype=float32"):
        assert item in over
    assert "rollout.backend=vllm" not in over
    bf16 = rt.engine_overrides(rt.settings(_args(dtype="bf16")))
    assert "model.dtype=bf16" in bf16 and "model.dtype=float32" not in bf16
    vllm = rt.engine_overrides({**s, "engine": "vllm",
                                "overrides": ["rollout.enforce_eager=false"]})
    assert vllm[-2:] == ["rollout.backend=vllm", "rollout.enforce_eager=false"]


def test_trl_rows_and_reward_score_as_the_engine_does(tmp_path):
    from bench import real_model_trl as rt
    path = tmp_path / "train.jsonl"
    row = {"data_source": "word_arith", "prompt": [{"role": "user", "content": "2+3?"}],
           "reward_model": {"style": "rule", "ground_truth": 5}, "extra_info": {"op": "add"}}
    path.write_text(json.dumps(row) + "\n")
    rows = rt.trl_rows(str(path))
    assert rows == [{"prompt": row["prompt"], "ground_truth": "5", "data_source": "word_arith"}]
    completions = [[{"role": "assistant", "content": "so it is 5"}],
                   [{"role": "assistant", "content": "#### 6"}]]
    assert rt.flexible_reward(None, completions, ["5", "5"], ["word_arith"] * 2) == [1.0, 0.0]


def test_generated_tokens_count_up_to_the_first_eos():
    from bench.real_model_trl import _lengths
    response = torch.tensor([[5, 6, 2, 0], [5, 6, 7, 8], [2, 0, 0, 0]])
    assert _lengths(response, eos_id=2).tolist() == [3, 4, 1]


def test_memory_bench_configs_and_table():
    from bench import real_model_memory as rm
    assert set(rm.CONFIGS) >= {"shipped", "micro16", "tiny"}
    over = rm.overrides("micro16", "/m", "/d", 2)
    assert "model.path=/m" in over and "actor.micro_batch_size=16" in over
    passes = {p: {"tensor_peak": 100 * 2 ** 20, "rss_growth": 40 * 2 ** 20,
                  "predicted": {"peak": 110 * 2 ** 20, "transient": {"logits": 50 * 2 ** 20}},
                  "predicted_at_width": 105 * 2 ** 20, "error": 0.1} for p in rm.PASSES}
    shapes = {"rows": 32, "prompt_width": 96, "max_new_tokens": 48, "widest_response": 48,
              "actor_micro": 8, "logprob_micro": 16, "generate_micro": 32}
    text = rm.report_config({"config": "shipped", "shapes": shapes, "passes": passes})
    assert "actor.update" in text and "1.1" in text  # predicted / measured
    off = {**passes, "actor.update": {**passes["actor.update"], "error": -0.4}}
    summary = rm.summarize([{"config": "shipped", "shapes": shapes, "passes": off}])
    assert (summary["within_target"], summary["passes"]) == (2, 3)
    assert summary["worst_abs_error"] == pytest.approx(0.4)


def test_memory_bench_needs_the_model_and_data(capsys, monkeypatch, tmp_path):
    from bench import real_model_memory as rm
    # CI sets the variable (the model is made there): the bench must still stop here.
    monkeypatch.delenv("HYBRIDFLOW_SMOLLM2_DIR", raising=False)
    with pytest.raises(SystemExit):
        rm.main(["--data", "/d"])
    assert "hybridflow model smollm2" in capsys.readouterr().err


def test_real_model_benches_name_the_missing_file(capsys, tmp_path):
    from bench import real_model_memory as rm
    from bench import real_model_trl as rt
    model = tmp_path / "model"
    model.mkdir()
    with pytest.raises(SystemExit):  # a folder that is not an HF model
        rm.main(["--model", str(model), "--data", str(tmp_path)])
    assert "no config.json" in capsys.readouterr().err
    (model / "config.json").write_text("{}")
    (tmp_path / "train.jsonl").write_text("")
    for main in (rm.main, rt.main):
        with pytest.raises(SystemExit):
            main(["--model", str(model), "--data", str(tmp_path)])
        err = capsys.readouterr().err
        assert "no test.jsonl" in err and "hybridflow data word_arith" in err


def test_stream_bench_variants_and_summary():
    from bench import real_model_stream as rs
    sync = rs.variant_overrides("synchronous", 2, "vllm", 6)
    stream = rs.variant_overrides("streaming", 2, "vllm", 6)
    for over in (sync, stream):  # the same placement and engine: only the mode differs
        assert "placement.roles.rollout=gen" in over and "rollout.backend=vllm" in over
    assert set(stream) - set(sync) == {"trainer.async_mode=streaming", "trainer.staleness=2",
                                       "actor.off_policy=decoupled"}
    assert "rollout.backend=vllm" not in rs.variant_overrides("streaming", 1, "hf", 6)
    metrics = [{"step": 0}] + [
        {"step": s, "perf/time_per_step": t, "perf/busy/main": 0.9, "perf/busy/gen": 0.5,
         "async/staleness/max": m, "async/staleness/mean": m / 2}
        for s, t, m in [(1, 9.0, 0), (2, 4.0, 1), (3, 2.0, 2), (4, 4.0, 2)]]
    out = rs.summarize(metrics, warmup=1)
    assert out["steps_done"] == 4 and out["step_s"] == 4.0  # warm-up step left out
    assert out["staleness_max_histogram"] == {1: 1, 2: 2}
    assert rs.summarize([], warmup=1) == {"steps_done": 0}
