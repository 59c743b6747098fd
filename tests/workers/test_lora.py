"""LoRA actors: only adapters train, save and load; the reference is the actor with its
adapters off (no second copy of the base); export merges the adapters into the base."""
import os

import pytest
import torch
from tests.support.workers import PROMPTS, make_cfg, prompt_batch, rollout_for_update
from transformers import AutoModelForCausalLM

from hybridflow.workers import ActorWorker, ReferenceWorker, WorkerContext
from hybridflow.workers.base import held_bytes
from hybridflow.workers.lora import ADAPTER_FILE
from hybridflow.workers.sequences import response_logprobs

pytest.importorskip("peft")


def lora_cfg(**actor):
    return make_cfg(actor={"lr": 3e-2, "lora": {"rank": 4, "alpha": 8}, **actor})


def colocated(cfg):
    """Actor and reference in one process, as the runtimes build them."""
    shared: dict = {}
    shared["actor"] = ActorWorker(cfg, WorkerContext(device="cpu", colocated=shared))
    shared["ref"] = ReferenceWorker(cfg, WorkerContext(device="cpu", colocated=shared))
    return shared["actor"], shared["ref"]


def adapter_names(module):
    return {n for n, _ in module.named_parameters() if "lora_" in n}


def test_reference_served_by_the_adapter_free_actor_equals_a_frozen_base_copy():
    cfg = lora_cfg()
    actor, ref = colocated(cfg)
    base = ReferenceWorker(make_cfg())  # a separate frozen copy of the same base
    assert ReferenceWorker.served_by(cfg) == "actor" and ReferenceWorker.served_by(make_cfg()) \
        is None
    data = rollout_for_update(actor)
    for _ in range(2):  # before the updates, then after them
        expected = base.logprob(data)["ref_log_prob"]
        assert torch.allclose(ref.logprob(data)["ref_log_prob"], expected, atol=1e-6, rtol=0)
        actor.update(data)
    moved = actor.logprob(data)["old_log_probs"]
    assert (moved - expected).abs().max() > 1e-3, "the updates should move the adapted policy"
    assert ref.module is actor.module and actor.module.training  # borrowed, mode restored


def test_only_adapter_parameters_train():
    actor = ActorWorker(lora_cfg())
    names = adapter_names(actor.module)
    assert names and {n for n, p in actor.module.named_parameters() if p.requires_grad} == names
    before = {n: p.detach().clone() for n, p in actor.module.named_parameters()}
    actor.update(rollout_for_update(actor))
    changed = {n for n, p in actor.module.named_parameters() if not torch.equal(before[n], p)}
    assert changed and changed <= names
    assert any("lora_B" in n for n in changed)  # B starts at zero: the adapter is now live


def test_saved_adapter_reloads_to_identical_outputs(tmp_path):
    cfg = lora_cfg()
    actor = ActorWorker(cfg)
    data = rollout_for_update(actor)
    actor.update(data)
    actor.save_checkpoint(str(tmp_path))
    files = set(os.listdir(tmp_path))
    assert {ADAPTER_FILE, "adapter_config.json"} <= files and "model.safetensors" not in files
    from safetensors.torch import load_file
    saved = load_file(str(tmp_path / ADAPTER_FILE))
    assert saved and all("lora_" in k for k in saved)
    fresh = ActorWorker(cfg)
    fresh.load_checkpoint(str(tmp_path))
    assert torch.equal(fresh.logprob(data)["old_log_probs"], actor.logprob(data)["old_log_probs"])
    assert fresh.trainer.scheduler.last_epoch == actor.trainer.scheduler.last_epoch
    plain = ActorWorker(make_cfg())
    with pytest.raises(FileNotFoundError, match="lora"):
        ActorWorker(cfg).load_checkpoint(str(tmp_path / "missing"))
    with pytest.raises(ValueError, match="does not fit"):  # adapters only, no base
        plain.load_checkpoint(str(tmp_path))


def test_export_merges_the_adapters_into_a_plain_hf_model(tmp_path):
    actor = ActorWorker(lora_cfg())
    data = rollout_for_update(actor)
    actor.update(data)
    actor.export(str(tmp_path / "merged"))
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "merged")
    assert not hasattr(merged, "peft_config")
    got, _ = response_logprobs(merged, data, 8, torch.device("cpu"))
    assert torch.allclose(got, actor.logprob(data)["old_log_probs"], atol=1e-5)
    actor.export(str(tmp_path / "adapter"), merged=False)
    assert ADAPTER_FILE in os.listdir(tmp_path / "adapter")


def test_held_bytes_count_the_shared_base_once():
    actor, ref = colocated(lora_cfg())
    actor.update(rollout_for_update(actor))
    held = held_bytes([actor.held_tensors(), ref.held_tensors()])
    base = sum(p.numel() * 4 for n, p in actor.module.named_parameters() if "lora_" not in n)
    adapters = sum(p.numel() * 4 for n, p in actor.module.named_parameters() if "lora_" in n)
    buffers = sum(b.numel() * b.element_size() for b in actor.module.buffers())
    assert held["engine/weight_bytes"] == base + adapters + buffers
    assert held["engine/optimizer_bytes"] == pytest.approx(2 * adapters, abs=4 * 64)  # Adam m, v
    full_actor, full_ref = ActorWorker(make_cfg()), ReferenceWorker(make_cfg())
    two = held_bytes([full_actor.held_tensors(), full_ref.held_tensors()])
    assert two["engine/weight_bytes"] == 2 * (base + buffers)


def test_rollout_generates_with_the_adapters_on():
    actor = ActorWorker(lora_cfg(lr=0.2))
    data = rollout_for_update(actor)
    for _ in range(3):
        actor.update(data)
    prompts = prompt_batch(actor.tokenizer, PROMPTS)
    adapted = actor.generate(prompts, n=1, do_sample=False)["responses"]
    with actor.base_policy():
        base = actor.generate(prompts, n=1, do_sample=False)["responses"]
    assert not torch.equal(adapted, base)


def test_a_reference_without_its_host_says_how_to_fix_it():
    ref = ReferenceWorker(lora_cfg(), WorkerContext(device="cpu"))
    data = rollout_for_update(ActorWorker(make_cfg()))
    with pytest.raises(RuntimeError, match="place both roles on one pool.*ref.path"):
        ref.logprob(data)
