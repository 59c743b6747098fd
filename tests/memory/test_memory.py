"""Memory predicted before launch (hybridflow/memory/): model sizes counted on the
meta device equal the real models', the KV-cache and optimizer formulas on
hand-computed cases, colocated roles summed per pool, and `check --memory`'s table
and its "does not fit" message. No timings: bench/memory.py compares predictions
with measured peaks."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from hybridflow.cli import main
from hybridflow.memory import (Architecture, MicroBatch, ModelSize, kv_cache_bytes, model_size,
                               training_state)
from hybridflow.memory.passes import saved_activations
from hybridflow.memory.roles import PoolMemory, RoleMemory
from hybridflow.workers.config import LoraConfig
from hybridflow.workers.models import model_bytes

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

LLAMA = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
         "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
         "vocab_size": 300, "tie_word_embeddings": False}
QWEN2_TIED = {"model_type": "qwen2", "hidden_size": 48, "intermediate_size": 96,
              "num_hidden_layers": 3, "num_attention_heads": 6, "num_key_value_heads": 2,
              "vocab_size": 500, "tie_word_embeddings": True}


def _config(values: dict, **extra):
    from transformers import AutoConfig
    values = {**values, **extra}
    return AutoConfig.for_model(values.pop("model_type"), **values)


def _real(values: dict, dtype=torch.float32, lora: LoraConfig | None = None, head="causal"):
    import transformers
    from hybridflow.workers.lora import apply_lora
    cls = {"causal": transformers.AutoModelForCausalLM,
           "value": transformers.AutoModelForTokenClassification}[head]
    model = cls.from_config(_config(values, **({"num_labels": 1} if head != "causal"
                                                else {}))).to(dtype)
    return apply_lora(model, lora) if lora is not None else model


@pytest.mark.parametrize("values", [LLAMA, QWEN2_TIED], ids=["llama", "qwen2-tied"])
@pytest.mark.parametrize("rank", [0, 4], ids=["full", "lora"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_meta_counts_equal_the_real_model(values, rank, dtype):
    lora = LoraConfig(rank=rank)
    real = _real(values, dtype, lora)
    counted = model_size(_config(values), "causal", dtype, lora)
    params = list(real.parameters())
    assert counted.params == sum(p.numel() for p in params)
    assert counted.trainable == sum(p.numel() for p in params if p.requires_grad)
    assert counted.weight_bytes == model_bytes(real)
    if rank:  # peft keeps float32 adapters on a bf16 base: counted as allocated
        assert counted.trainable_bytes == 4 * counted.trainable
        assert counted.trainable < counted.params


def test_tied_embeddings_are_counted_once():
    tied = model_size(_config(QWEN2_TIED))
    untied = model_size(_config(QWEN2_TIED, tie_word_embeddings=False))
    assert untied.params - tied.params == QWEN2_TIED["vocab_size"] * QWEN2_TIED["hidden_size"]


def test_value_head_counts_equal_the_real_critic():
    real = _real(LLAMA, head="value")
    counted = model_size(_config(LLAMA), "value")
    assert counted.params == sum(p.numel() for p in real.parameters())
    assert counted.params < model_size(_config(LLAMA)).params  # no lm_head, a 1-wide one


def test_architecture_reads_gqa_shapes():
    arch = model_size(_config(QWEN2_TIED)).arch
    assert (arch.hidden, arch.layers, arch.heads, arch.kv_heads, arch.head_dim,
            arch.vocab) == (48, 3, 6, 2, 8, 500)


def _hand_size(trainable=1000, tensors=3, largest=600, dtype_bytes=4, params=None):
    arch = Architecture(hidden=64, intermediate=128, layers=2, heads=4, kv_heads=2,
                        head_dim=16, vocab=100)
    params = trainable if params is None else params
    return ModelSize(params=params, trainable=trainable, param_bytes=params * dtype_bytes,
                     trainable_bytes=trainable * dtype_bytes, trainable_tensors=tensors,
                     buffer_bytes=0, largest_trainable_bytes=largest * dtype_bytes,
                     dtype_bytes=dtype_bytes, arch=arch)


def test_kv_cache_bytes_by_hand():
    size = _hand_size(dtype_bytes=2)
    # 4 rows x 100 tokens x 2 layers x (K and V) x 2 kv heads x 16 dims x 2 bytes
    assert kv_cache_bytes(size, rows=4, length=100) == 4 * 100 * 2 * 2 * 2 * 16 * 2 == 102400


def test_adamw_state_by_hand():
    state = training_state(_hand_size(trainable=1000, tensors=3, largest=600))
    assert state["gradients"] == 4000                    # fp32, one per trainable element
    assert state["optimizer"] == 2 * 4000 + 3 * 4        # exp_avg, exp_avg_sq, fp32 steps
    assert state["optimizer step"] == 2 * 600 * 4        # single-tensor AdamW on CPU
    cuda = training_state(_hand_size(), cuda=True, shards=2, ddp_buckets=True)
    assert cuda["gradients"] == 2000 and cuda["optimizer step"] == 2000  # foreach: all grads
    assert cuda["ddp buckets"] == 2000


def test_saved_activations_by_hand():
    size = _hand_size()
    micro = MicroBatch(rows=2, prompt=6, response=4)
    # 20 tokens x 2 layers x (4 x 128 + 10.5 x 64 + width 10) x 4 bytes
    assert saved_activations(size, micro) == 20 * 2 * (512 + 672 + 10) * 4
    lora = _hand_size(trainable=10, params=1000)
    assert saved_activations(lora, micro) < saved_activations(size, micro)
    # packed rows run maskless: no padding mask kept per layer
    packed = MicroBatch(rows=2, prompt=6, response=4, masked=False)
    assert saved_activations(size, packed) == 20 * 2 * (512 + 672) * 4


def test_packed_rows_predict_no_padding_mask_in_the_update():
    """`model.use_remove_padding` (sdpa_varlen, no mask) drops the per-layer mask term of
    the update's activations, and only that: the log-prob pass is unchanged."""
    common = ("trainer.keep_unneeded_passes=true",)
    padded = _actor_memory(*common)
    packed = _actor_memory(*common, "model.use_remove_padding=true")
    assert packed.passes["actor.update"]["activations"] < \
        padded.passes["actor.update"]["activations"]
    assert packed.passes["actor.logprob"] == padded.passes["actor.logprob"]


def test_a_pool_sums_resident_bytes_and_takes_the_largest_pass():
    actor = RoleMemory("actor", "main", {"weights": 100, "optimizer": 200},
                       {"actor.update": {"activations": 500}, "actor.logprob": {"logits": 50}})
    ref = RoleMemory("ref", "main", {"weights": 100}, {"ref.logprob": {"logits": 600}})
    pool = PoolMemory("main", [actor, ref], capacity=1000)
    assert pool.peak == 100 + 200 + 100 + 600 and pool.peak_pass() == "ref.logprob"
    assert pool.fits
    assert not PoolMemory("main", [actor, ref], capacity=900).fits


def test_check_memory_prints_roles_pools_and_ok(capsys):
    code = main(["check", os.path.join(REPO, "graphs", "ppo.py"), "--memory"])
    out = capsys.readouterr().out
    assert code == 0
    for text in ("memory per device (device cpu", "actor@main: peak", "critic.update: +",
                 "ref.logprob: +", "rule-based scores: no model",
                 "rollout.generate: +", "served by actor's worker in the same process",
                 "pool main (actor, critic, ref, reward, rollout)", "-> fits"):
        assert text in out, text
    assert out.rstrip().endswith("ok")


def test_check_memory_says_which_role_does_not_fit(capsys):
    big = ["model.path=null", "placement.cluster.device=a100-40g"] + [
        f"model.hf_config.{key}={value}" for key, value in (
            ("hidden_size", 4096), ("intermediate_size", 11008), ("num_hidden_layers", 32),
            ("num_attention_heads", 32), ("num_key_value_heads", 32))]  # ~6.5B in fp32
    code = main(["check", os.path.join(REPO, "graphs", "grpo.py"), "--memory", *big])
    captured = capsys.readouterr()
    assert code == 1
    assert "DOES NOT FIT" in captured.out
    assert "does not fit: pool 'main' needs" in captured.err
    assert "of 40.00 GiB per a100-40g device (role 'actor' needs" in captured.err


def test_check_without_memory_does_not_import_the_memory_model():
    code = ("import sys; from hybridflow.cli import main; "
            f"main(['check', {os.path.join(REPO, 'graphs', 'grpo.py')!r}]); "
            "print('memory loaded' if 'hybridflow.memory' in sys.modules else 'lazy')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": REPO}, timeout=300)
    assert out.stdout.strip().endswith("lazy"), out.stdout + out.stderr


def _role_memory(role, *overrides):
    from hybridflow.memory.report import plan_memory
    from hybridflow.program.assemble import prepare
    loaded = prepare(os.path.join(REPO, "graphs", "grpo.py"), list(overrides), preflight=False)
    report = plan_memory(loaded.cfg, loaded.plan)
    return next(r for r in report.roles if r.role == role)


def _actor_memory(*overrides):
    return _role_memory("actor", *overrides)


def test_a_rollout_on_its_own_pool_holds_its_own_weights():
    colocated = _role_memory("rollout")
    assert colocated.resident == {} and "rollout.generate" in colocated.passes
    own = _role_memory("rollout", "placement.pools.gen.devices_per_node=1",
                       "placement.roles.rollout=gen")
    assert own.pool == "gen"
    assert own.resident["weights"] == _actor_memory().resident["weights"]
    assert own.passes["rollout.generate"]["kv cache"] > 0


def test_fsdp2_shards_the_actor_state_and_ddp_adds_buckets():
    four = ["placement.pools.main.devices_per_node=4", "placement.cluster.device=h100"]
    ddp = _actor_memory(*four)
    fsdp = _actor_memory(*four, "actor.strategy=fsdp2")
    assert fsdp.resident["weights"] == ddp.resident["weights"] // 4
    assert "ddp buckets" in ddp.passes["actor.update"]
    assert "ddp buckets" not in fsdp.passes["actor.update"]
    single = _actor_memory("placement.cluster.device=h100")
    assert "ddp buckets" not in single.passes["actor.update"]


def test_generate_peak_counts_one_recorded_step_not_every_steps_scores():
    from hybridflow.memory.passes import generate_pass
    size = _hand_size()  # vocab 100, fp32, 2 layers, 2 KV heads of 16
    cache = kv_cache_bytes(size, rows=2, length=53)
    step = 2 * 100 * 4  # rows x vocab x float32
    hf = generate_pass(size, rows=2, prompt=3, response=50)
    # the full cache, one layer of it again, the sampling's four tensors + the recorder's
    assert hf == {"kv cache": cache + cache // 4, "sampling": 5 * step}
    plain = generate_pass(size, rows=2, prompt=3, response=50, records_logprobs=False)
    assert plain["sampling"] == 4 * step
    longer = generate_pass(size, rows=2, prompt=3, response=100)
    assert longer["sampling"] == hf["sampling"]  # nothing vocab-wide grows with the steps


def _allocated_peak(fn) -> int:
    """The highest running sum of the CPU allocator's events while `fn` runs."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    current = peak = 0
    for _, nbytes in sorted((e.start_ns(), e.nbytes()) for e in
                            prof.profiler.kineto_results.events() if e.name() == "[memory]"):
        current += nbytes
        peak = max(peak, current)
    return peak


def test_the_hf_engines_generate_peak_matches_the_prediction_on_a_wide_vocabulary():
    """A 20k vocabulary makes every step's scores (the old model: 3 x rows x steps x
    vocab floats, ~86 MB here) dwarf the KV cache: the engine's peak must be the
    one-step figure, as SmolLM2's (49k vocabulary) is (bench/real_model_memory.py)."""
    from types import SimpleNamespace

    from hybridflow.core.batch import Batch
    from hybridflow.memory.passes import generate_pass
    from hybridflow.workers.config import RolloutConfig
    from hybridflow.workers.rollout.hf import HFEngine
    values = {**LLAMA, "vocab_size": 20_000, "num_hidden_layers": 1}
    torch.manual_seed(0)
    model = _real(values)
    tokenizer = SimpleNamespace(pad_token_id=0, eos_token_id=1)
    engine = HFEngine(model, tokenizer, torch.device("cpu"), shares_module=True)
    rows, prompt, response = 6, 8, 60
    ids = torch.randint(2, 20_000, (rows, prompt))
    prompts = Batch({"input_ids": ids, "attention_mask": torch.ones_like(ids)})
    opts = RolloutConfig(max_new_tokens=response, micro_batch_size=rows)
    out = {}
    measured = _allocated_peak(lambda: out.update(batch=engine.generate(prompts, opts)))
    width = int(out["batch"]["response_mask"].sum(1).max())
    predicted = sum(generate_pass(model_size(_config(values), "causal", torch.float32),
                                  rows, prompt, width).values())
    assert width > response // 2  # random weights seldom sample the eos id
    assert 0.7 * measured <= predicted <= 1.3 * measured, (predicted, measured)


def test_trained_bf16_models_count_float32_master_weights():
    from hybridflow.workers.training import master_weights
    real = _real(LLAMA, torch.bfloat16)
    master_weights(real)  # what the trainer does to a bf16 model
    counted = model_size(_config(LLAMA), "causal", torch.bfloat16, trained=True)
    assert counted.weight_bytes == model_bytes(real)
    assert counted.trainable_bytes == 4 * counted.trainable
    assert counted.dtype_bytes == 2  # the forward still computes in bf16
    frozen = model_size(_config(LLAMA), "causal", torch.bfloat16)  # reference
    assert frozen.param_bytes == 2 * frozen.params


def test_micro_rows_by_rows_or_by_token_budget():
    from hybridflow.memory.roles import micro_rows
    assert micro_rows(64, 16, None, 40) == 16          # rows
    assert micro_rows(64, 16, 400, 40) == 10           # 400 tokens of 40-wide rows
    assert micro_rows(64, 16, 10_000, 40) == 64        # never more rows than the batch
    assert micro_rows(64, 16, 30, 40) == 1             # a row wider than the budget: alone


def test_a_token_budget_sizes_the_predicted_activations():
    """The budget, not `micro_batch_size`, decides a budgeted pass's micro-batch: a
    budget of one row's width predicts the activations of one-row micro-batches."""
    # one mini-batch of 32 rows is one optimizer step, whose old log-probs the compiler
    # removes: keep the pass, whose memory is what this test sizes
    common = ("data.batch_size=8", "rollout.n=4", "actor.micro_batch_size=32",
              "actor.mini_batch_size=32", "rollout.log_prob_micro_batch_size=32",
              "trainer.keep_unneeded_passes=true")
    rows = _actor_memory(*common)
    width = 16 + 4  # data.max_prompt_length + rollout.max_new_tokens (embedded defaults)
    budget = _actor_memory(*common, f"actor.max_tokens_per_micro_batch={width}",
                           f"rollout.log_prob_max_tokens_per_micro_batch={width}")
    one_row = _actor_memory(*common[:2], "actor.micro_batch_size=1",
                            "actor.mini_batch_size=32", "rollout.log_prob_micro_batch_size=1",
                           common[-1])
    for node in ("actor.update", "actor.logprob"):
        assert budget.passes[node] == one_row.passes[node]
        assert sum(budget.passes[node].values()) < sum(rows.passes[node].values())


def test_prepacked_linear_adds_a_copy_of_the_weights_to_generate():
    """`rollout.prepacked_linear` (the hf engine, fp32): oneDNN's packed copy of the
    weights lives through the generate call."""
    plain = _role_memory("rollout")
    packed = _role_memory("rollout", "rollout.prepacked_linear=true")
    weights = _actor_memory().resident["weights"]  # the module it generates with
    assert packed.passes["rollout.generate"]["prepacked weights"] == weights
    assert "prepacked weights" not in plain.passes["rollout.generate"]


def test_ref_and_actor_prepacked_linear_add_a_copy_of_the_weights_to_log_prob_passes():
    plain = _role_memory("ref")
    packed = _role_memory("ref", "ref.prepacked_linear=true")
    weights = packed.resident["weights"]  # the reference's own model
    assert packed.passes["ref.logprob"]["prepacked weights"] == weights
    assert "prepacked weights" not in plain.passes["ref.logprob"]
    keep = "trainer.keep_unneeded_passes=true"  # GRPO's one-step update drops actor.logprob
    actor = _actor_memory(keep, "actor.prepacked_linear=true")
    assert actor.passes["actor.logprob"]["prepacked weights"] == actor.resident["weights"]
    assert "prepacked weights" not in actor.passes["actor.update"]
    assert "prepacked weights" not in _actor_memory(keep).passes["actor.logprob"]
