"""`check --memory` against what a real vLLM engine holds on a CPU host (issue 36, class
6): the `vllm` engine built at tp=2 in two gloo ranks (each pinned to a core of its own:
VLLM_CPU_OMP_THREADS_BIND "0|1") on the toy checkpoint, as a rollout on a pool of its
own builds it, generates once; each rank's resident set (psutil) is compared with the
prediction's per-rank peak of that pool, and the two ranks together with what the
prediction's host line counts for them. With $HYBRIDFLOW_SMOLLM2_DIR set, the real
model too, at tp=1 (its 9 heads and 3 KV heads admit no tp=2; tp=3 needs 3 cores).

Tolerance: 20 % of the prediction. The prediction holds constants measured on this
build (the process, vLLM's runtime; hybridflow/memory/engines.py); RSS of one build
varied by 0.17 GiB between runs on the real model. Real vLLM (the CPU build, in
.ci/vllm.sh's environment); skipped without it."""
import json
import os

import pytest

pytest.importorskip("vllm")

from tests.support.vllm_memory import engine_cfg, run_rank
from tests.support.ports import free_port

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOY = os.path.join(REPO, "graphs", "assets", "toy_base")
TOLERANCE = 0.20
KV_GIB = 0.25


def _measured(tmp_path, model_dir: str, world: int) -> list[dict]:
    import torch.multiprocessing as mp
    mp.spawn(run_rank, args=(world, free_port(), model_dir, KV_GIB, str(tmp_path)),
             nprocs=world, join=True)
    return [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(world)]


def _predicted(model_dir: str, tp: int):
    """The memory report of a run whose rollout is that engine on a pool of its own."""
    from hybridflow.memory.report import plan_memory
    from hybridflow.program.assemble import prepare
    cfg = engine_cfg(model_dir, KV_GIB)
    overrides = [f"model.{k}={v}" for k, v in cfg["model"].items()] + \
        [f"rollout.{k}={v}" for k, v in cfg["rollout"].items()] + \
        [f"placement.pools.gen.devices_per_node={tp}", "placement.roles.rollout=gen",
         f"placement.parallel.rollout.tp={tp}", "runtime.name=ray"]
    loaded = prepare(os.path.join(REPO, "graphs", "grpo.py"), overrides, preflight=False)
    report = plan_memory(loaded.cfg, loaded.plan)
    pool = next(p for p in report.pools if p.pool == "gen")
    counted = [count * each for what, count, each in report.host.processes
               if what == "rank(s) of pool 'gen'"]
    return pool, counted[0]


def _models():
    models = [("toy", TOY, 2)]
    real = os.environ.get("HYBRIDFLOW_SMOLLM2_DIR")
    if real and os.path.isfile(os.path.join(real, "config.json")):
        models.append(("smollm2", real, 1))
    return models


@pytest.mark.parametrize("name, model_dir, tp", _models(), ids=[m[0] for m in _models()])
def test_the_prediction_per_rank_and_per_host_is_the_engines_resident_set(
        name, model_dir, tp, tmp_path):
    ranks = _measured(tmp_path, model_dir, tp)
    pool, host_part = _predicted(model_dir, tp)
    assert [r["tp"] for r in ranks] == [tp] * tp and all(r["tokens"] > 0 for r in ranks)
    rollout = pool.roles[0].resident
    assert rollout["kv cache"] == int(KV_GIB * 2 ** 30)
    for rank, got in enumerate(ranks):
        # the KV cache is really allocated (touched): the build grew by more than it
        assert got["built"] - got["before"] > rollout["kv cache"]
        error = abs(got["generated"] - pool.peak) / pool.peak
        assert error <= TOLERANCE, (name, rank, got, pool.peak, rollout)
    together = sum(r["generated"] for r in ranks)
    print(f"{name} tp={tp}: per rank measured "
          f"{[round(r['generated'] / 2 ** 30, 2) for r in ranks]} GiB, predicted "
          f"{pool.peak / 2 ** 30:.2f} GiB ({rollout}); ranks together {together / 2 ** 30:.2f}"
          f" GiB, predicted {host_part / 2 ** 30:.2f} GiB")
    assert host_part == tp * pool.peak
    assert abs(together - host_part) / host_part <= TOLERANCE, (together, host_part)
