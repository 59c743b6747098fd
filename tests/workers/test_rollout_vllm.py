"""The vLLM engine against a fake `vllm.LLM` (vLLM itself cannot run here): what it
asks vLLM for, the order of its calls, and that nothing it sends would fail to
serialise in vLLM's multiprocess executor."""
import json
import pickle
from types import SimpleNamespace

import pytest
import torch

from tests.support.workers import make_cfg, prompt_batch
from hybridflow.workers.base import WorkerContext
from hybridflow.workers.config import ModelConfig, RolloutConfig, read_section
from hybridflow.workers.rollout.engine import UNKNOWN_VERSION, EngineSpec
from hybridflow.workers.rollout.vllm import (SLEEP_LEVEL, log_probs_from_outputs,
                                             make_vllm_engine, prompt_token_lists,
                                             responses_from_outputs, sampling_kwargs)
from hybridflow.workers.rollout.weights import plain_weight_name, policy_weights
from hybridflow.workers.tokenizer import load_tokenizer, tokenizer_spec


class FakeLLM:
    """Records calls like vLLM's `LLM`. Unless the engine runs in the rank's own
    process (external_launcher), a function sent to the workers must pickle, as in
    vLLM's multiprocess executor: lambdas and closures are refused."""

    def __init__(self, **kwargs):
        self.kwargs, self.calls, self.loaded = kwargs, [], {}
        self.in_process = kwargs.get("distributed_executor_backend") == "external_launcher"

    def _send(self, fn):
        if not self.in_process:
            try:
                pickle.dumps(fn)
            except (pickle.PicklingError, AttributeError, TypeError) as err:
                raise TypeError(f"vLLM's multiprocess executor cannot serialise {fn!r}: "
                                f"{err}") from err

    def apply_model(self, fn):
        self._send(fn)
        model = SimpleNamespace(load_weights=self._load)
        return [fn(model)]

    def collective_rpc(self, method, args=()):
        self._send(method)
        return [method(SimpleNamespace(), *args)]

    def _load(self, weights):
        names = []
        for name, tensor in weights:
            self.loaded[name] = tensor.clone()
            names.append(name)
        self.calls.append(("load", len(names)))

    def reset_prefix_cache(self):
        self.calls.append(("reset_prefix_cache",))

    def sleep(self, level):
        self.calls.append(("sleep", level))

    def wake_up(self, tags=None):
        self.calls.append(("wake_up", tuple(tags or ())))

    def generate(self, prompts, params, use_tqdm=False):
        self.calls.append(("generate", len(prompts)))
        eos = params.kwargs["stop_token_ids"][0]
        return [_output([5, 6, eos], [-0.5, -0.25, -1.0]) for _ in prompts]


class FakeParams:
    def __init__(self, **kwargs):
        self.kwargs = kwargs


def _output(ids, logps):
    ranked = [{t: SimpleNamespace(logprob=lp)} for t, lp in zip(ids, logps)]
    return SimpleNamespace(outputs=[SimpleNamespace(token_ids=ids, logprobs=ranked)])


def _spec(module=None, **rollout):
    cfg = make_cfg(rollout={"backend": "vllm", "weight_bucket_mb": 0.01, **rollout})
    model_cfg = read_section(cfg, "model", ModelConfig)
    tok = load_tokenizer(tokenizer_spec(model_cfg))
    return EngineSpec(model_cfg, read_section(cfg, "rollout", RolloutConfig), tok,
                      WorkerContext(), torch.device("cpu"), module=module)


def test_engine_runs_in_the_rank_process_with_a_causal_lm_config(monkeypatch):
    engine = make_vllm_engine(_spec(), FakeLLM, FakeParams)
    kwargs = engine.llm.kwargs
    assert kwargs["distributed_executor_backend"] == "external_launcher"
    assert kwargs["max_model_len"] == 128  # the tiny model's max_position_embeddings
    assert kwargs["enable_prefix_caching"] and kwargs["logprobs_mode"] == "processed_logprobs"
    with open(f"{kwargs['model']}/config.json") as fh:
        assert json.load(fh)["architectures"] == ["LlamaForCausalLM"]  # not an embedding model
    # its own pool: the seeded initial weights are loaded at once, as version 0
    assert engine.policy_version == 0 and engine.llm.loaded
    assert ("sleep", SLEEP_LEVEL) not in engine.llm.calls  # keeps its weights between syncs


def test_weights_go_in_buckets_and_the_prefix_cache_is_reset_after():
    from hybridflow.workers.models import build_causal_lm
    spec = _spec()
    module = build_causal_lm(spec.model_cfg, spec.tokenizer, "cpu", 0)
    engine = make_vllm_engine(spec, FakeLLM, FakeParams)
    engine.llm.calls.clear()
    from hybridflow.workers.rollout.weights import refresh_engine
    refresh_engine(engine, module, version=3, bucket_bytes=4096)
    loads = [c for c in engine.llm.calls if c[0] == "load"]
    assert len(loads) > 1 and all(n >= 1 for _, n in loads)  # per bucket, not all at once
    assert engine.llm.calls[-1] == ("reset_prefix_cache",)
    assert engine.policy_version == 3
    weights = policy_weights(module)
    assert set(engine.llm.loaded) == set(weights)
    assert all(torch.equal(engine.llm.loaded[k], v) for k, v in weights.items())


def test_colocated_engine_sleeps_at_level_2_and_reloads_before_generating():
    from hybridflow.workers import ActorWorker
    from hybridflow.workers.rollout import engine as registry
    actor = ActorWorker(make_cfg(rollout={"backend": "hf"}))
    spec = _spec(module=actor.module)
    actor._engine = make_vllm_engine(spec, FakeLLM, FakeParams)
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


def test_the_fake_refuses_what_a_multiprocess_executor_cannot_send():
    llm = FakeLLM(distributed_executor_backend="mp")
    with pytest.raises(TypeError, match="cannot serialise"):
        llm.apply_model(lambda model: model.load_weights([]))
    from hybridflow.workers.rollout.vllm import VLLMEngine
    engine = VLLMEngine(llm, FakeParams, None, torch.device("cpu"), sleep_mode=False)
    engine.load_weights([("w", torch.ones(1))])  # what the engine sends does pickle
    engine.finish_weight_update(1)
    assert llm.loaded["w"].tolist() == [1.0] and engine.policy_version == 1


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


def test_vllm_backend_without_vllm_says_how_to_install():
    from hybridflow.workers import ActorWorker
    actor = ActorWorker(make_cfg(rollout={"backend": "vllm"}))
    with pytest.raises(ImportError, match=r"hybridflow\[vllm\]"):
        actor.generate(prompt_batch(actor.tokenizer, ["1+2="]))


def test_fsdp2_runs_on_the_cpu_too():
    from hybridflow.workers import ActorWorker  # gloo; see tests/workers/test_actor_fsdp2.py
    assert ActorWorker(make_cfg(actor={"strategy": "fsdp2"})).trainer.backend.name == "fsdp2"
