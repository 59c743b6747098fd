"""workers/mfu.py: each model phase's FLOP rate against the measured matmul peak
(`perf/mfu`), counted from the model's linear layers and the real tokens."""
import time

import pytest
import torch

from hybridflow.core import device_peak as peaks
from hybridflow.core.batch import Batch
from hybridflow.core.metric_names import MFU, node_scoped
from hybridflow.workers import ActorWorker
from hybridflow.workers.mfu import FORWARD, engine_matmul_params, matmul_params, phase_mfu, \
    real_tokens
from tests.support.workers import PROMPTS, make_cfg, prompt_batch, rollout_for_update


def test_matmul_params_count_linear_weights_not_the_embedding_lookup():
    model = torch.nn.Sequential(torch.nn.Embedding(100, 8), torch.nn.Linear(8, 16),
                                torch.nn.Linear(16, 100, bias=False))
    assert matmul_params(model) == 8 * 16 + 16 * 100


def test_an_engine_is_counted_by_its_module_else_by_its_own_count():
    class Engine:
        module, matmul_params = None, 0
    hf, vllm, none = Engine(), Engine(), Engine()
    hf.module = torch.nn.Linear(8, 16)
    vllm.matmul_params = 1234  # vLLM's layers are not nn.Linear: it counts them itself
    assert [engine_matmul_params(e) for e in (hf, vllm, none, object())] == [128, 1234, 0, 0]


def test_real_tokens_skip_the_padding():
    batch = Batch({"attention_mask": torch.tensor([[0, 1, 1], [1, 1, 1]])})
    assert real_tokens(batch) == 5 and real_tokens(Batch()) == 0


def test_a_phase_without_work_reports_nothing():
    assert phase_mfu(torch.nn.Linear(4, 4), "cpu", torch.float32, FORWARD, 0,
                     time.perf_counter()) == {}


def test_the_peak_is_measured_once_per_device_dtype_and_threads(monkeypatch):
    calls = []
    monkeypatch.setattr(peaks, "_PEAKS", {})
    monkeypatch.setattr(peaks, "matmul_flops", lambda **kw: calls.append(kw) or 1e9)
    assert peaks.device_peak("cpu", torch.float32) == peaks.device_peak("cpu") == 1e9
    assert len(calls) == 1


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_cpu_peak_also_times_onednn_which_computes_the_same_product(dtype):
    a, b = torch.randn(64, 32).to(dtype), torch.randn(32, 48).to(dtype)
    onednn = peaks._onednn_mm(b, 64)
    if onednn is None:
        pytest.skip("this torch has no oneDNN linear")
    torch.testing.assert_close(onednn(a, b), a @ b)
    assert peaks.matmul_flops(size=64, repeats=1, dtype=dtype) > 0


def test_the_scheduler_names_the_rate_after_its_node():
    assert node_scoped("actor.update", {MFU: 0.5, "actor/pg_loss": 1.0}) == \
        {"perf/mfu/actor.update": 0.5, "actor/pg_loss": 1.0}


@pytest.mark.slow  # generates, scores and trains the tiny actor (~9 s with its imports)
def test_each_actor_phase_reports_a_rate_below_the_peak():
    actor = ActorWorker(make_cfg())
    torch.manual_seed(0)
    generated = actor.generate(prompt_batch(actor.tokenizer, PROMPTS), n=2)
    scored = actor.logprob(generated)
    updated = actor.update(rollout_for_update(actor))
    for out in (generated, scored, updated):
        assert 0 < out.meta["metrics"][MFU] < 1.5, out.meta["metrics"]
    empty = actor.logprob(generated.take(list(range(0))))
    assert MFU not in empty.meta.get("metrics", {})


def test_a_rollout_on_its_own_pool_reports_its_rate():
    from hybridflow.workers import RolloutWorker
    rollout = RolloutWorker(make_cfg())  # no actor beside it: its own engine and weights
    out = rollout.generate(prompt_batch(rollout.engine.tokenizer, PROMPTS), n=2)
    assert 0 < out.meta["metrics"][MFU] < 1.5, out.meta["metrics"]


@pytest.mark.vllm
@pytest.mark.slow  # builds a vLLM engine (~15 s on 2 cores)
def test_the_vllm_engine_counts_the_weights_the_hf_model_multiplies():
    pytest.importorskip("vllm")
    from hybridflow.workers import RolloutWorker
    from tests.support.vllm_real import vllm_cfg
    cfg = vllm_cfg()
    actor, rollout = ActorWorker(cfg), RolloutWorker(cfg)
    assert rollout.engine.matmul_params == matmul_params(actor.module) > 0
    out = rollout.generate(prompt_batch(actor.tokenizer, PROMPTS), n=2)
    assert 0 < out.meta["metrics"][MFU] < 1.5, out.meta["metrics"]
    rollout.engine.close()
