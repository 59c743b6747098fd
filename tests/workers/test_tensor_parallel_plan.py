"""Tensor parallelism without a process group: the plan read from the model class (or the
project's for Llama/Qwen2), the refusals (an untranslatable style, a model with no plan,
DDP at tp > 1, LoRA at tp > 1, a context with no process group), a role context's layout
(rank -> dp and tp ranks, as dispatch sends rows), the runtime handing a role its tp and
seeding sampling per data-parallel rank, and the plain-tensor paths of the log-prob math."""
import pytest
import torch

from tests.support.workers import make_cfg
from hybridflow.core.context import WorkerContext
from hybridflow.core.tokens import entropy_from_logits as core_entropy
from hybridflow.runtime.worker_shell import FusedWorker, default_context
from hybridflow.workers.backends import make_backend
from hybridflow.workers.parallel.tensor_parallel import (LLAMA_PLAN, full_logits,
                                                         is_tensor_parallel, layer_plan,
                                                         parallelize)
from hybridflow.workers.config import ActorConfig, read_section
from hybridflow.workers.rollout.hf import _stream_seed
from hybridflow.workers.parallel.vocab_parallel import entropy_from_logits, token_logprobs

CPU = torch.device("cpu")


def _tiny(model_type: str, **extra):
    from transformers import AutoConfig, AutoModelForCausalLM
    config = AutoConfig.for_model(model_type, hidden_size=16, intermediate_size=32,
                                  num_hidden_layers=1, num_attention_heads=2,
                                  num_key_value_heads=2, vocab_size=12, **extra)
    return AutoModelForCausalLM.from_config(config)


@pytest.mark.parametrize("model_type", ["llama", "qwen2"])
def test_the_plan_is_the_model_class_own(model_type):
    assert layer_plan(_tiny(model_type)) == LLAMA_PLAN


def test_a_llama_whose_class_ships_no_plan_gets_the_project_plan(monkeypatch):
    model = _tiny("llama")
    monkeypatch.setattr(type(model.config), "base_model_tp_plan", None)
    assert layer_plan(model) == LLAMA_PLAN


def test_a_model_without_any_plan_is_refused_by_name(monkeypatch):
    model = _tiny("llama")
    monkeypatch.setattr(type(model.config), "base_model_tp_plan", None)
    monkeypatch.setattr(model.config, "model_type", "gpt_neox_like")
    with pytest.raises(ValueError, match="'gpt_neox_like' ships no tensor-parallel plan"):
        layer_plan(model)


def test_a_style_hybridflow_does_not_translate_gives_way_to_the_projects_plan(monkeypatch):
    model = _tiny("llama")
    plan = {**LLAMA_PLAN, "layers.*.mlp.gate_up_proj": "packed_colwise"}
    monkeypatch.setattr(type(model.config), "base_model_tp_plan", plan)
    assert layer_plan(model) == LLAMA_PLAN  # the project's plan for its model type
    monkeypatch.setattr(model.config, "model_type", "llama_like")  # and none of its own
    with pytest.raises(ValueError, match=r"uses style\(s\) \['packed_colwise'\], which "
                                         r"hybridflow does not translate"):
        parallelize(model, mesh=None)


def test_ddp_refuses_a_tensor_parallel_mesh():
    with pytest.raises(ValueError, match=r"'ddp' does not shard by tensor parallelism.*fsdp2"):
        make_backend("ddp", 1, CPU, mesh=object())


def test_lora_at_tp2_is_refused_naming_both_keys():
    from hybridflow.workers.lora import apply_lora
    from hybridflow.workers.training import Trainer
    opt = read_section(make_cfg(actor={"lora": {"rank": 4, "alpha": 8}}), "actor", ActorConfig)
    module = apply_lora(_tiny("llama"), opt.lora)
    ctx = WorkerContext(rank=0, world_size=2, tp=2)  # refused before any process group
    with pytest.raises(ValueError, match=r"placement\.parallel\.actor\.tp=2 with "
                                         r"actor\.lora\.rank=4"):
        Trainer(module, opt, ctx, CPU)


def test_a_context_places_rank_r_at_dp_r_div_tp_and_tp_r_mod_tp():
    layout = [(c.dp_rank, c.tp_rank) for c in
              (WorkerContext(rank=r, world_size=4, tp=2) for r in range(4))]
    assert layout == [(0, 0), (0, 1), (1, 0), (1, 1)]  # ranks 0,1 and 2,3 are tp groups
    assert WorkerContext(rank=3, world_size=4, tp=2).dp == 2
    assert WorkerContext(world_size=4).device_mesh() is None  # tp=1: no mesh


def test_a_tp_context_without_a_process_group_says_to_use_ray():
    ctx = WorkerContext(rank=0, world_size=1, tp=2)  # world 1: init_distributed no-ops
    with pytest.raises(ValueError, match="does not divide"):
        ctx.device_mesh()
    ctx = WorkerContext(rank=0, world_size=2, tp=2)
    with pytest.raises(RuntimeError, match="MASTER_ADDR"):
        ctx.device_mesh()


class _Recorder:
    def __init__(self, cfg, ctx):
        self.ctx = ctx


def test_the_runtime_gives_each_role_its_tp_and_seeds_per_dp_rank():
    seeds = []
    with torch.random.fork_rng(devices=[]):
        for rank in range(4):
            worker = FusedWorker("main", rank, 4, rank, torch_threads=None)
            worker.start({}, {}, ["actor", "critic"], {"actor": _Recorder, "critic": _Recorder},
                         100, default_context, tp={"actor": 2})
            assert worker.roles["actor"].ctx.tp == 2 and worker.roles["critic"].ctx.tp == 1
            seeds.append(torch.initial_seed())
    assert seeds == [100, 100, 101, 101]  # one sampling stream per tp group


def test_the_streaming_sampler_seed_is_per_dp_rank():
    seeds = [_stream_seed(WorkerContext(rank=r, world_size=4, tp=2, seed=3)) for r in range(4)]
    assert seeds[0] == seeds[1] != seeds[2] == seeds[3]


def test_plain_logits_take_the_whole_vocabulary_path():
    logits = torch.randn(2, 3, 11)
    tokens = torch.randint(0, 11, (2, 3))
    expected = torch.log_softmax(logits, -1).gather(-1, tokens[..., None])[..., 0]
    assert torch.allclose(token_logprobs(logits, tokens), expected, atol=1e-6)
    assert torch.equal(entropy_from_logits(logits), core_entropy(logits))


def test_full_logits_leaves_an_unsharded_model_alone():
    model = _tiny("llama")
    assert not is_tensor_parallel(model)
    with full_logits(model) as inside:
        assert inside is model and not model.lm_head._forward_hooks
