"""Issue 30, item 6: the memory model sizes each rank of a tensor-parallel role by its
slice (weights, gradients, moments, KV cache and logits split tp ways; hidden-sized
activations whole on every rank), so a model that does not fit one device at tp=1
fits at tp=2 -- the same layout the workers build."""
from __future__ import annotations

import os

import pytest

from hybridflow.memory.model_size import tensor_parallel_slice
from hybridflow.memory.report import plan_memory
from hybridflow.program.assemble import prepare
from tests.support.recorded_runs import REPO

TWO = ("runtime.name=ray", "placement.pools.main.devices_per_node=2")
# ~2.7B parameters in float32: 10 GB of weights, 20 GB of AdamW moments per copy
BIG = ("model.path=null", "placement.cluster.device=a100-40g", *(
    f"model.hf_config.{key}={value}" for key, value in (
        ("hidden_size", 2560), ("intermediate_size", 6912), ("num_hidden_layers", 32),
        ("num_attention_heads", 32), ("num_key_value_heads", 32))))


def report(*overrides):
    loaded = prepare(os.path.join(REPO, "graphs", "grpo.py"), list(overrides), preflight=False)
    return plan_memory(loaded.cfg, loaded.plan)


def role(rep, name):
    return next(r for r in rep.roles if r.role == name)


def tp(size: int) -> tuple[str, ...]:
    return (f"placement.parallel.actor.tp={size}", f"placement.parallel.ref.tp={size}")


def test_a_tensor_parallel_rank_holds_its_slice_of_the_state():
    one, two = report(*TWO, *tp(1)), report(*TWO, *tp(2))
    for name in ("actor", "ref"):
        assert role(two, name).resident["weights"] < 0.55 * role(one, name).resident["weights"]
    assert role(two, "actor").resident["optimizer"] < 0.55 * \
        role(one, "actor").resident["optimizer"]
    # one tp group of 2 ranks reads every row the 2 data-parallel ranks split at tp=1
    gen_one, gen_two = (role(r, "rollout").passes["rollout.generate"] for r in (one, two))
    assert gen_two["batch"] == 2 * gen_one["batch"]
    # ... and holds half the heads' KV cache of those twice-as-many rows
    assert gen_two["kv cache"] == pytest.approx(gen_one["kv cache"], rel=0.05)


def test_a_model_too_big_for_one_rank_fits_at_tp_2():
    alone, split = report(*TWO, *BIG, *tp(1)), report(*TWO, *BIG, *tp(2))
    assert not alone.pools[0].fits and split.pools[0].fits
    assert role(split, "actor").peak < 0.55 * role(alone, "actor").peak


def test_the_slice_keeps_hidden_sized_shapes_and_splits_the_rest():
    from hybridflow.memory.model_size import Architecture, ModelSize
    arch = Architecture(hidden=64, intermediate=130, layers=2, heads=4, kv_heads=2,
                        head_dim=16, vocab=81)
    size = ModelSize(params=1000, trainable=1000, param_bytes=4000, trainable_bytes=4000,
                     trainable_tensors=10, buffer_bytes=64, largest_trainable_bytes=400,
                     dtype_bytes=4, arch=arch)
    half = tensor_parallel_slice(size, 2)
    assert (half.arch.hidden, half.arch.intermediate, half.arch.heads, half.arch.kv_heads,
            half.arch.vocab) == (64, 65, 2, 1, 41)
    assert (half.param_bytes, half.buffer_bytes, half.trainable_tensors) == (2000, 64, 10)
    assert tensor_parallel_slice(size, 1) is size
