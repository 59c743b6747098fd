"""The prediction's arithmetic on a CPU host (issue 36, class 6): an engine with a fixed
KV cache holds its weights, `rollout.kv_cache_gib` and its runtime per rank (not
`gpu_memory_utilization` of the host's RAM); a rank counts its process; a host sums
every process placed on it and says fits / does not fit with its total. The
measured side is tests/memory/test_vllm_memory_real.py (real vLLM)."""
from __future__ import annotations

import os
from types import SimpleNamespace

import pytest

from hybridflow.cli import main
from hybridflow.memory import report
from hybridflow.memory.engines import PROCESS_BYTES, engine_parts, engine_sleeps
from hybridflow.memory.hosts import PoolMemory, host_memory
from hybridflow.memory.report import format_report, plan_memory
from hybridflow.memory.roles import RoleMemory
from hybridflow.plan.placement import Placement, PoolSpec
from hybridflow.program.assemble import prepare
from hybridflow.workers.rollout.engine_memory import EngineMemory, engine_memory

GIB = 1 << 30
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GRPO = os.path.join(REPO, "graphs", "grpo.py")
VLLM_TP3 = ("rollout.backend=vllm", "placement.parallel.actor.tp=3", "runtime.name=ray",
            "placement.pools.main.devices_per_node=3", "actor.strategy=fsdp2",
            "model.path=null", "model.tokenizer=char", "model.hf_config.num_attention_heads=6",
            "model.hf_config.num_key_value_heads=3", "model.hf_config.hidden_size=48",
            "data.batch_size=6", "actor.mini_batch_size=6")


def _s(kv_gib=1.0, util=0.5, sleep=True):
    return {"rollout": SimpleNamespace(kv_cache_gib=kv_gib, gpu_memory_utilization=util,
                                       enable_sleep_mode=sleep)}


def test_a_fixed_kv_cache_is_what_the_engine_holds_not_a_share_of_the_host():
    engine = EngineMemory(reserves_device=True, fixed_kv_cache=True, host_bytes=300,
                          host_weight_copies=1.0)
    notes = []
    parts = engine_parts(_s(kv_gib=1.0), engine, 1000, capacity=24 * GIB, cuda=False,
                         notes=notes)
    assert parts == {"engine weights": 1000, "kv cache": GIB, "engine runtime": 1300}
    assert notes == []
    on_gpu = engine_parts(_s(kv_gib=0.5), engine, 1000, capacity=80 * GIB, cuda=True,
                          notes=notes)
    assert on_gpu == {"engine weights": 1000, "kv cache": GIB // 2}


def test_without_a_fixed_kv_cache_the_engine_reserves_its_share_and_says_so():
    engine = EngineMemory(reserves_device=True, fixed_kv_cache=True)
    notes = []
    parts = engine_parts(_s(kv_gib=0, util=0.5), engine, 1000, capacity=24 * GIB,
                         cuda=False, notes=notes)
    assert parts == {"vllm reservation": 12 * GIB}
    assert "rollout.kv_cache_gib=0" in notes[0] and "this machine's RAM, per rank" in notes[0]


@pytest.mark.parametrize("cuda, colocated, sleeps", [
    (True, True, True), (True, False, False), (False, True, False), (False, False, False)])
def test_the_engine_sleeps_only_on_a_gpu_beside_the_actor(cuda, colocated, sleeps):
    assert engine_sleeps(_s(), cuda, colocated) is sleeps
    assert engine_sleeps(_s(sleep=False), cuda, colocated) is False


def test_vllm_declares_a_fixed_kv_cache_and_its_cpu_runtime():
    vllm = engine_memory("vllm")
    assert vllm.reserves_device and vllm.fixed_kv_cache
    assert 0 < vllm.host_bytes < GIB and vllm.host_weight_copies >= 0


def _pool(name, resident, passes, process=100):
    role = RoleMemory("r", name, resident={"weights": resident}, passes={"r.x": {"a": passes}})
    return PoolMemory(name, [role], capacity=10_000, process=process)


def test_a_rank_counts_its_process_and_a_host_every_rank_placed_on_it():
    main_pool, gen = _pool("main", 1000, 500), _pool("gen", 300, 50)
    assert main_pool.peak == 100 + 1000 + 500
    placement = Placement({"main": PoolSpec("main", 2, 3), "gen": PoolSpec("gen", 1, 2)},
                          {"r": "main"})
    ray = host_memory([main_pool, gen], placement, True, capacity=8000, process=100)
    # a pool over 2 nodes puts devices_per_node=3 ranks on each; plus the driver
    assert ray.total == 3 * 1600 + 2 * 450 + 100 and ray.fits
    local = host_memory([main_pool, gen], placement, False, capacity=7000, process=100)
    # one process: every simulated rank's resident bytes, the largest pass once
    assert local.total == 100 + 6 * 1000 + 2 * 300 + 500 and not local.fits


def _report(*overrides):
    loaded = prepare(GRPO, list(overrides), preflight=False)
    return plan_memory(loaded.cfg, loaded.plan)


def test_three_ranks_that_each_fit_and_together_do_not_are_refused_naming_the_total(
        monkeypatch, capsys):
    """The issue's instance: each rank of a tp=3 pool fits the machine, the three do
    not; the host line states the total and `check --memory` exits 1 on it."""
    each = _report(*VLLM_TP3).pools[0].peak
    monkeypatch.setattr(report, "machine_memory_bytes", lambda: int(2.5 * each))
    got = _report(*VLLM_TP3)
    assert got.pools[0].fits and not got.host.fits
    assert got.host.processes[0] == ("rank(s) of pool 'main'", 3, each)
    assert got.host.total == 3 * each + PROCESS_BYTES
    text = format_report(got)
    assert "host (every process on one machine): 3 rank(s) of pool 'main' x" in text
    assert "-> DOES NOT FIT" in text.splitlines()[-1]
    problems = got.problems()
    assert len(problems) == 1 and problems[0].startswith("does not fit: this host needs")
    assert "CPU processes share the machine's RAM" in problems[0]
    rollout = next(r for r in got.roles if r.role == "rollout")
    assert rollout.resident["kv cache"] == GIB  # rollout.kv_cache_gib, not util x RAM
    assert "vllm reservation" not in rollout.resident
    monkeypatch.setattr("hybridflow.program.placement_checks.allowed_cores",
                        lambda: {0, 1, 2})  # three cores for the three vLLM ranks
    monkeypatch.setattr("hybridflow.program.preflight._missing", lambda module: None)
    code = main(["check", GRPO, "--memory", *VLLM_TP3])
    out, err = capsys.readouterr()
    assert code == 1 and "does not fit: this host needs" in err, (out, err)


def test_the_local_runtime_is_one_process_on_its_host():
    got = _report()
    assert [what for what, _, _ in got.host.processes] == [
        "process (local runtime: every role of every rank)"]
    pool = got.pools[0]
    assert got.host.total == pool.process + pool.resident + pool.largest_pass


def test_a_gpu_device_has_no_host_line_and_no_process():
    got = _report("placement.cluster.device=h100")
    assert got.host is None and all(p.process == 0 for p in got.pools)
    assert "host (" not in format_report(got)
