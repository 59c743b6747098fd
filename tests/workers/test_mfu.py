"""workers/mfu.py: each model phase's FLOP rate against the measured matmul peak
(`perf/mfu`), counted from the model's linear layers and the real tokens."""
import time

import pytest
import torch

from hybridflow.core import device_peak as peaks
from hybridflow.core.batch import Batch
from hybridflow.core.metric_names import MFU, node_scoped
from hybridflow.workers import ActorWorker
from hybridflow.workers.mfu import FORWARD, matmul_params, phase_mfu, real_tokens
from tests.support.workers import PROMPTS, make_cfg, prompt_batch, rollout_for_update


def test_matmul_params_count_linear_weights_not_the_embedding_lookup():
    model = torch.nn.Sequential(torch.nn.Embedding(100, 8), torch.nn.Linear(8, 16),
                                torch.nn.Linear(16, 100, bias=False))
    assert matmul_params(model) == 8 * 16 + 16 * 100


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
