"""The vLLM engine against a fake `vllm.LLM` (the main suite's environment has no
vLLM; tests/workers/rollout/test_vllm_real.py runs the real one): what it asks vLLM
for and the order of its calls."""
import importlib.util
import json

import pytest
import torch

from tests.support.vllm_fakes import FAKE_RELOAD, FakeLLM, FakeParams
from tests.support.vllm_fakes import fake_output as _output
from tests.support.workers import make_cfg, prompt_batch
from hybridflow.workers.base import WorkerContext
from hybridflow.workers.config import ModelConfig, RolloutConfig, read_section
from hybridflow.workers.rollout.engine import UNKNOWN_VERSION, EngineSpec
from hybridflow.workers.rollout.vllm import (SLEEP_LEVEL, log_probs_from_outputs, make_vllm_engine,
                                             prompt_token_lists, responses_from_outputs,
                                             sampling_kwargs)
from hybridflow.workers.rollout.weights import plain_weight_name, policy_weights
from hybridflow.workers.tokenizer import load_tokenizer, tokenizer_spec


def _spec(module=None, **rollout):
    cfg = make_cfg(rollout={"backend": "vllm", "weight_bucket_mb": 0.01, **rollout})
    model_cfg = read_section(cfg, "model", ModelConfig)
    tok = load_tokenizer(tokenizer_spec(model_cfg))
    return EngineSpec(model_cfg, read_section(cfg, "rollout", RolloutConfig), tok,
                      WorkerContext(), torch.device("cpu"), module=module)


def test_engine_runs_in_the_rank_process_with_a_causal_lm_config(monkeypatch):
    engine = make_vllm_engine(_spec(), FakeLLM, FakeParams, FAKE_RELOAD)
    kwargs = engine.llm.kwargs
    assert kwargs["distributed_executor_backend"] == "external_launcher"
    assert kwargs["max_model_len"] == 128  # the tiny model's max_position_embeddings
    assert kwargs["enable_prefix_caching"] and kwargs["logprobs_mode"] == "processed_logprobs"
    assert kwargs["dtype"] == "float32"  # vLLM's name, not the model section's "fp32"
    assert kwargs["kv_cache_memory_bytes"] == 1 << 30  # rollout.kv_cache_gib=1: a fixed size
    with open(f"{kwargs['generation_config']}/generation_config.json") as fh:
        gen = json.load(fh)  # vLLM stops at this eos too: the tokenizer's
    assert (gen["eos_token_id"], gen["bos_token_id"]) == (engine.tokenizer.eos_token_id,
                                                          engine.tokenizer.bos_token_id)
    with open(f"{kwargs['model']}/config.json") as fh:
        assert json.load(fh)["architectures"] == ["LlamaForCausalLM"]  # not an embedding model
    # its own pool: the seeded initial weights are loaded at once, as version 0
    assert engine.policy_version == 0 and engine.llm.loaded
    assert ("sleep", SLEEP_LEVEL) not in engine.llm.calls  # keeps its weights between syncs
    assert "max_num_seqs" not in kwargs  # vLLM's default unless rollout.max_num_seqs is set
    assert make_vllm_engine(_spec(max_num_seqs=8), FakeLLM, FakeParams,
                            FAKE_RELOAD).llm.kwargs["max_num_seqs"] == 8


def test_weights_go_in_buckets_and_the_prefix_cache_is_reset_after():
    from hybridflow.workers.models import build_causal_lm
    spec = _spec()
    module = build_causal_lm(spec.model_cfg, spec.tokenizer, "cpu", 0)
    engine = make_vllm_engine(spec, FakeLLM, FakeParams, FAKE_RELOAD)
    engine.llm.calls.clear()
    from hybridflow.workers.rollout.weights import refresh_engine
    refresh_engine(engine, module, version=3, bucket_bytes=4096)
    loads = [c for c in engine.llm.calls if c[0] == "load"]
    assert len(loads) > 1 and all(n >= 1 for _, n in loads)  # per bucket, not all at once
    # one layerwise-reload session around all the buckets, then the prefix cache reset
    assert engine.llm.calls[0] == ("begin_reload",)
    assert engine.llm.calls[-2:] == [("finish_reload",), ("reset_prefix_cache",)]
    assert [c[0] for c in engine.llm.calls].count("begin_reload") == 1
    assert engine.policy_version == 3
    weights = policy_weights(module)
    assert set(engine.llm.loaded) == set(weights)
    assert all(torch.equal(engine.llm.loaded[k], v) for k, v in weights.items())


def test_colocated_engine_sleeps_at_level_2_and_reloads_before_generating():
    from hybridflow.workers import ActorWorker
    from hybridflow.workers.rollout import engine as registry
    actor = ActorWorker(make_cfg(rollout={"backend": "hf"}))
    spec = _spec(module=actor.module)
    actor._engine = make_vllm_engine(spec, FakeLLM, FakeParams, FAKE_RELOAD)
    llm = actor._engine.llm
    assert llm.calls == [("sleep", 2)] and actor._engine.policy_version == UNKNOWN_VERSION
    assert registry.UNKNOWN_VERSION == UNKNOWN_VERSION
    out = actor.generate(prompt_batch(actor.tokenizer, ["1+2=", "3+4="]), n=2)
    kinds = [c[0] for c in llm.calls[1:]]
    first_load, reset = kinds.index("load"), kinds.index("reset_prefix_cache")
    assert kinds[0] == "wake_up" and llm.calls[1] == ("wake_up", ("weights",))
    assert first_load < reset < kinds.index("generate")
    assert llm.calls[1 + kinds.index("generate") - 1] == ("wake_up", ("kv_cache",))
    assert llm.calls[-1] == ("sleep", 2)
    assert out["policy_version"].tolist() == [0] * 4
    assert out["rollout_log_probs"][0].tolist()[:3] == [-0.5, -0.25, -1.0]
    assert out["response_length"].tolist() == [3] * 4


def test_the_fake_refuses_what_vllm_refuses():
    from functools import partial

    from hybridflow.workers.rollout.vllm import VLLMEngine, load_into_model
    llm = FakeLLM(distributed_executor_backend="mp")
    for fn in (lambda model: None, partial(load_into_model, weights=[])):  # msgpack: no function
        with pytest.raises(TypeError, match="cannot serialise"):
            llm.apply_model(fn)
    llm = FakeLLM(distributed_executor_backend="external_launcher")
    engine = VLLMEngine(llm, FakeParams, None, torch.device("cpu"), sleep_mode=False)
    engine.load_weights([("w", torch.ones(1))])  # the first load: no session needed
    engine.finish_weight_update(1)
    with pytest.raises(AttributeError, match="weight_loader"):  # outside a reload session
        engine.load_weights([("w", torch.ones(1))])
    with pytest.raises(ValueError, match="Sleep mode"):
        llm.sleep(level=2)
    engine = VLLMEngine(FakeLLM(distributed_executor_backend="external_launcher"), FakeParams,
                        None, torch.device("cpu"), sleep_mode=False, reload=FAKE_RELOAD)
    for version in (1, 2):
        engine.load_weights([("w", torch.full((1,), float(version)))])
        engine.finish_weight_update(version)
    assert engine.llm.loaded["w"].tolist() == [2.0] and engine.policy_version == 2


def test_no_sleep_mode_where_the_platform_has_none():
    from hybridflow.workers import ActorWorker
    actor = ActorWorker(make_cfg(rollout={"backend": "hf"}))
    engine = make_vllm_engine(_spec(module=actor.module), FakeLLM, FakeParams, FAKE_RELOAD,
                              sleep_available=False)
    assert engine.llm.kwargs["enable_sleep_mode"] is False and not engine.sleep_mode
    engine.sleep()  # a no-op: the fake refuses sleep without sleep mode
    assert engine.llm.calls == []


def test_an_unsupported_head_size_is_refused_before_vllm_starts(monkeypatch):
    from hybridflow.workers.rollout import vllm_checks
    monkeypatch.setattr(vllm_checks, "supported_head_sizes", lambda: [32, 64])
    built = []
    with pytest.raises(ValueError, match=r"head size 8 .*allowed: 32, 64"):
        make_vllm_engine(_spec(), lambda **kw: built.append(kw), FakeParams, FAKE_RELOAD)
    assert built == []


def test_dtype_names_are_vllms():
    from hybridflow.workers.rollout.vllm_checks import vllm_dtype
    assert [vllm_dtype(n) for n in ("bf16", "fp32", "fp16", "bfloat16")] == \
        ["bfloat16", "float32", "float16", "bfloat16"]
    with pytest.raises(ValueError, match="unknown model dtype 'f8'"):
        vllm_dtype("f8")


def test_prompts_lose_their_left_padding():
    ids = torch.tensor([[0, 0, 5, 6], [7, 8, 9, 10]])
    mask = torch.tensor([[0, 0, 1, 1], [1, 1, 1, 1]])
    assert prompt_token_lists(ids, mask) == [[5, 6], [7, 8, 9, 10]]


def test_sampling_kwargs_greedy_and_sampled_ask_for_the_sampled_logprob():
    greedy = sampling_kwargs(RolloutConfig(do_sample=False, max_new_tokens=7), 1)
    assert greedy["temperature"] == 0.0 and greedy["max_tokens"] == 7
    assert greedy["stop_token_ids"] == [1] and greedy["n"] == 1 and greedy["logprobs"] == 0
    sampled = sampling_kwargs(RolloutConfig(temperature=0.6, top_k=0, top_p=0.9), [1, 2])
    assert (sampled["temperature"], sampled["top_k"], sampled["top_p"]) == (0.6, -1, 0.9)


def test_outputs_become_right_padded_responses_and_log_probs():
    outs = [_output(ids, [-0.1 * (i + 1) for i in range(len(ids))])
            for ids in ([4, 5, 1], [6], [7, 8, 9, 10, 11])]
    got = responses_from_outputs(outs, width=4, pad_id=0)
    assert got.tolist() == [[4, 5, 1, 0], [6, 0, 0, 0], [7, 8, 9, 10]]
    logps = log_probs_from_outputs(outs, width=4)
    assert torch.allclose(logps[0], torch.tensor([-0.1, -0.2, -0.3, 0.0]))
    assert torch.allclose(logps[1], torch.tensor([-0.1, 0.0, 0.0, 0.0]))


def test_weight_names_lose_wrapper_prefixes_and_lora_factors():
    assert plain_weight_name("module.model.layers.0.mlp.up_proj.weight") == \
        "model.layers.0.mlp.up_proj.weight"
    assert plain_weight_name("base_model.model.model.layers.0.self_attn.q_proj.base_layer"
                             ".weight") == "model.layers.0.self_attn.q_proj.weight"
    assert plain_weight_name("base_model.model.model.layers.0.self_attn.q_proj.lora_A.default"
                             ".weight") is None


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed")
def test_vllm_backend_without_vllm_says_how_to_install():
    from hybridflow.workers import ActorWorker
    actor = ActorWorker(make_cfg(rollout={"backend": "vllm"}))
    with pytest.raises(ImportError, match=r"hybridflow\[vllm\]"):
        actor.generate(prompt_batch(actor.tokenizer, ["1+2="]))


def test_fsdp2_runs_on_the_cpu_too():
    from hybridflow.workers import ActorWorker  # gloo; see tests/workers/test_actor_fsdp2.py
    assert ActorWorker(make_cfg(actor={"strategy": "fsdp2"})).trainer.backend.name == "fsdp2"
