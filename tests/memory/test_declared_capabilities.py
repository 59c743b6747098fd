"""The memory model reads what engines and training strategies declare
(workers/rollout/engine_memory.py, the backend classes' `shards` / `gradient_buckets`),
never their names: the declarations cover the registries, and changing a declaration
changes the prediction."""
from __future__ import annotations

import os

import pytest

from hybridflow.workers.backends import BACKENDS
from hybridflow.workers.rollout import engine_names
from hybridflow.workers.rollout import engine_memory as table

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OWN_POOL = ("placement.pools.gen.devices_per_node=1", "placement.roles.rollout=gen",
            "placement.cluster.device=h100",
            "rollout.max_new_tokens=64")  # long enough that the last decode step is the peak


def test_every_built_in_engine_declares_its_memory_and_only_registered_ones_do():
    assert set(table.declared_engines()) == {"hf", "vllm"} <= set(engine_names())
    assert table.engine_memory("vllm").reserves_device
    assert table.engine_memory("hf").records_log_probs
    assert table.engine_memory("a user's engine") == table.EngineMemory()


@pytest.mark.parametrize("name", sorted(BACKENDS))
def test_every_backend_declares_how_it_keeps_state(name):
    cls = BACKENDS[name]
    assert isinstance(cls.shards, bool) and isinstance(cls.gradient_buckets, bool)
    assert isinstance(cls.tensor_parallel, bool)


def test_the_built_in_strategies_declare_what_they_are():
    assert BACKENDS["fsdp2"].shards and not BACKENDS["fsdp2"].gradient_buckets
    assert BACKENDS["ddp"].gradient_buckets and not BACKENDS["ddp"].shards


def test_the_prediction_follows_the_declaration_not_the_name(monkeypatch):
    from hybridflow.memory.report import plan_memory
    from hybridflow.program.assemble import prepare
    loaded = prepare(os.path.join(REPO, "graphs", "grpo.py"), list(OWN_POOL), preflight=False)

    def rollout():
        return next(r for r in plan_memory(loaded.cfg, loaded.plan).roles
                    if r.role == "rollout")
    plain = rollout()
    assert "weights" in plain.resident and "kv cache" in plain.passes["rollout.generate"]
    # the same hf engine, declared as one that reserves a device fraction
    monkeypatch.setitem(table._MEMORY, "hf", table.EngineMemory(reserves_device=True))
    reserving = rollout()
    assert "weights" not in reserving.resident
    # on a pool of its own the engine never sleeps (only one colocated with the actor)
    assert set(reserving.resident) == {"vllm reservation"}
    # and as one with a fixed KV cache (vLLM's declaration): weights and the cache
    monkeypatch.setitem(table._MEMORY, "hf", table.EngineMemory(reserves_device=True,
                                                                fixed_kv_cache=True))
    assert set(rollout().resident) == {"engine weights", "kv cache"}  # a GPU: no runtime
    # and as one without the log-prob recorder: one [rows, vocab] less per step
    monkeypatch.setitem(table._MEMORY, "hf", table.EngineMemory())
    unrecorded = rollout()
    assert unrecorded.passes["rollout.generate"]["sampling"] == \
        plain.passes["rollout.generate"]["sampling"] * 4 // 5
