"""Issue 30, item 1: a role's `placement.parallel` is what its workers build, or `check`
refuses it before launch naming the role and the numbers -- and `check` prints the
layout that will run."""
from __future__ import annotations

import pytest

from hybridflow.cli import main
from hybridflow.plan.placement import Placement
from hybridflow.workers.backends import BACKENDS
from hybridflow.workers.rollout.engine import engine_names, engine_supports_tp
from tests.support.recorded_runs import graph_path

GRPO = graph_path("grpo.py")
RAY_TWO = ("runtime.name=ray", "placement.pools.main.devices_per_node=2")


def check(capsys, *overrides) -> tuple[int, str, str]:
    code = main(["check", GRPO, *overrides])
    out = capsys.readouterr()
    return code, out.out, out.err


def tp_backend() -> str | None:
    return next((n for n, b in sorted(BACKENDS.items()) if getattr(b, "tensor_parallel", False)),
                None)


# ------------------------------------------------------------- refused layouts
@pytest.mark.parametrize("overrides, words", [
    # dp x tp does not fill the pool
    ((*RAY_TWO, "placement.parallel.actor.tp=2", "placement.parallel.actor.dp=2"),
     ["placement.parallel.actor", "dp=2 x tp=2 = 4", "pool 'main' has 2", "set dp=1"]),
    # tp does not divide the toy model's 4 heads (and 2 kv heads)
    (("runtime.name=ray", "placement.pools.main.devices_per_node=3",
      "placement.parallel.actor.tp=3"),
     ["placement.parallel.actor.tp=3", "num_attention_heads=4", "[1, 2]"]),
    (("runtime.name=ray", "placement.pools.main.devices_per_node=4",
      "placement.parallel.ref.tp=4"),
     ["placement.parallel.ref.tp=4", "num_key_value_heads=2", "role 'ref'"]),
    # the local runtime runs every rank in one process
    (("placement.pools.refs.devices_per_node=2", "placement.roles.ref=refs",
      "placement.parallel.ref.tp=2"),
     ["placement.parallel.ref.tp=2", "local runtime", "--runtime ray"]),
    # LoRA adapters on a tensor-parallel actor
    ((*RAY_TWO, "placement.parallel.actor.tp=2", "actor.strategy=fsdp2", "actor.lora.rank=4"),
     ["placement.parallel.actor.tp=2", "actor.lora.rank=4", "not supported"]),
    # a training strategy without tensor parallelism
    ((*RAY_TWO, "placement.parallel.actor.tp=2", "actor.strategy=ddp"),
     ["placement.parallel.actor.tp=2", "actor.strategy='ddp'", "tp=1"]),
])
def test_a_layout_the_workers_cannot_build_is_refused_by_check(capsys, overrides, words):
    code, _, err = check(capsys, *overrides)
    assert code != 0
    line = err.strip().splitlines()[-1]
    for word in words:
        assert word in line, (word, line)
    assert "Traceback" not in err


def test_an_engine_without_tensor_parallelism_is_refused_for_a_generating_role(capsys,
                                                                             monkeypatch):
    from hybridflow.workers.rollout import engine as registry
    plain = [n for n in engine_names() if not engine_supports_tp(n)]
    if not plain:  # every built-in engine runs tp: one registered without it
        monkeypatch.setitem(registry._ENGINES, "plain", registry._ENGINES["hf"])
        plain = ["plain"]
    extra = (f"actor.strategy={tp_backend()}",) if tp_backend() else ()
    if not tp_backend():
        pytest.skip("no training backend shards by tensor parallelism yet")
    code, _, err = check(capsys, *RAY_TWO, "placement.parallel.actor.tp=2", *extra,
                         f"rollout.backend={plain[0]}")
    assert code != 0 and f"rollout.backend={plain[0]!r}" in err and "tp=1" in err, err


# --------------------------------------------------------------- what check prints
def test_check_prints_each_tensor_parallel_roles_groups(capsys):
    code, out, err = check(capsys, *RAY_TWO, "placement.parallel.ref.tp=2")
    assert code == 0, err
    assert "layout: ref on pool main: dp 1 x sp 1 x tp 2, tp groups [[0, 1]]" in out


def test_check_prints_a_sequence_parallel_roles_groups_and_that_generation_ignores_sp(
        capsys):
    code, out, err = check(capsys, *RAY_TWO, "placement.parallel.actor.sp=2")
    assert code == 0, err
    assert ("layout: actor on pool main: dp 1 x sp 2 x tp 1, sp groups [[0, 1]]; "
            "generation ignores sp (dp 2)") in out


def test_a_role_at_sp_x_tp_prints_its_tp_and_its_sp_groups():
    placement = Placement.from_config({"pools": {"main": {"devices_per_node": 8}},
                                       "roles": {"actor": "main"},
                                       "parallel": {"actor": {"tp": 2, "sp": 2}}})
    # tp innermost: a tp group is consecutive ranks, an sp group strides over tp
    assert placement.layout_lines(["actor"]) == [
        "  layout: actor on pool main: dp 2 x sp 2 x tp 2, tp groups [[0, 1], [2, 3], "
        "[4, 5], [6, 7]], sp groups [[0, 2], [1, 3], [4, 6], [5, 7]]; generation ignores sp "
        "(dp 4)"]


def test_a_folded_role_runs_on_its_hosts_layout():
    placement = Placement.from_config({"pools": {"main": {"devices_per_node": 4}},
                                       "roles": {"actor": "main", "rollout": "main"},
                                       "parallel": {"actor": {"tp": 2}}})
    placement.folded = {"rollout": "actor"}
    assert placement.tp_size("rollout") == 2
    placement.parallel["rollout"] = {"tp": 1}  # its own entry wins
    assert placement.tp_size("rollout") == 1
    assert placement.layout_lines(["actor"]) == [
        "  layout: actor on pool main: dp 2 x sp 1 x tp 2, tp groups [[0, 1], [2, 3]]"]
