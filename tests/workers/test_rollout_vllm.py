"""The vLLM backend's pure-Python parts (vLLM itself is not installed here)."""
from types import SimpleNamespace

import pytest
import torch

from conftest import make_cfg
from hybridflow.workers.config import RolloutConfig
from hybridflow.workers.rollout_vllm import (COLOCATED_STEPS, prompt_token_lists,
                                             responses_from_outputs, run_steps,
                                             sampling_kwargs, vllm_weight_name, vllm_weights)


def test_prompts_lose_their_left_padding():
    ids = torch.tensor([[0, 0, 5, 6], [7, 8, 9, 10]])
    mask = torch.tensor([[0, 0, 1, 1], [1, 1, 1, 1]])
    assert prompt_token_lists(ids, mask) == [[5, 6], [7, 8, 9, 10]]


def test_sampling_kwargs_greedy_and_sampled():
    greedy = sampling_kwargs(RolloutConfig(do_sample=False, max_new_tokens=7), 1)
    assert greedy["temperature"] == 0.0 and greedy["max_tokens"] == 7
    assert greedy["stop_token_ids"] == [1] and greedy["n"] == 1
    sampled = sampling_kwargs(RolloutConfig(temperature=0.6, top_k=0, top_p=0.9), [1, 2])
    assert (sampled["temperature"], sampled["top_k"], sampled["top_p"]) == (0.6, -1, 0.9)


def test_outputs_become_right_padded_responses():
    outs = [SimpleNamespace(outputs=[SimpleNamespace(token_ids=ids)])
            for ids in ([4, 5, 1], [6], [7, 8, 9, 10, 11])]
    got = responses_from_outputs(outs, width=4, pad_id=0)
    assert got.tolist() == [[4, 5, 1, 0], [6, 0, 0, 0], [7, 8, 9, 10]]


def test_weight_names_lose_wrapper_prefixes_and_lora_factors():
    assert vllm_weight_name("module.model.layers.0.mlp.up_proj.weight") == \
        "model.layers.0.mlp.up_proj.weight"
    assert vllm_weight_name("base_model.model.model.layers.0.self_attn.q_proj.base_layer.weight") \
        == "model.layers.0.self_attn.q_proj.weight"
    assert vllm_weight_name("base_model.model.model.layers.0.self_attn.q_proj.lora_A.default"
                            ".weight") is None
    names = [n for n, _ in vllm_weights({"model.rotary_emb.inv_freq": torch.ones(1),
                                         "lm_head.weight": torch.ones(1)})]
    assert names == ["lm_head.weight"]


class FakeEngine:
    def __init__(self):
        self.calls = []

    def wake_up(self, tags):
        self.calls.append(("wake_up", tuple(tags)))

    def sleep(self, level):
        self.calls.append(("sleep", level))

    def apply_model(self, fn):
        model = SimpleNamespace(load_weights=lambda w: self.calls.append(("load", len(w))))
        fn(model)

    def generate(self, prompts, params, use_tqdm=False):
        self.calls.append(("generate", len(prompts)))
        return ["out"] * len(prompts)


def test_sleep_wake_sequence_loads_weights_before_the_kv_cache():
    engine = FakeEngine()
    out = run_steps(engine, COLOCATED_STEPS, weights=[("w", 1), ("v", 2)], prompts=[1, 2],
                    params=None)
    assert out == ["out", "out"]
    assert engine.calls == [("wake_up", ("weights",)), ("load", 2), ("wake_up", ("kv_cache",)),
                            ("generate", 2), ("sleep", 1)]


def test_vllm_backend_without_vllm_says_how_to_install():
    from hybridflow.workers import ActorWorker
    with pytest.raises(ImportError, match=r"hybridflow\[vllm\]"):
        ActorWorker(make_cfg(rollout={"backend": "vllm"}))


def test_fsdp2_runs_on_the_cpu_too():
    from hybridflow.workers import ActorWorker  # gloo; see tests/workers/test_actor_fsdp2.py
    assert ActorWorker(make_cfg(actor={"strategy": "fsdp2"})).trainer.backend.name == "fsdp2"
