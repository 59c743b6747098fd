"""The real model (SmolLM2-135M: 9 attention heads, 3 key/value heads) at actor tp=3 with
`actor.strategy=fsdp2`, in whichever environment runs it (issue 36, item 3): the main
one, and .ci/vllm.sh's, whose transformers (5.19) gives Llama the plan
`embed_tokens: embedding_rowwise` that the worker once refused at construction after
`check` said ok. `check` accepts the layout with the worker's own plan code; the actor
is built through the worker's code in three gloo ranks (one tp group) and one forward
gives one unsharded rank's log-probs. Needs $HYBRIDFLOW_SMOLLM2_DIR (.ci/model.sh);
marked `vllm` so that the vLLM suite runs it too (it needs no vLLM)."""
import os

import pytest
import torch

from hybridflow.cli import main
from tests.support.recorded_runs import graph_path
from tests.support.ports import free_port

MODEL = os.environ.get("HYBRIDFLOW_SMOLLM2_DIR", "")
pytestmark = [pytest.mark.slow, pytest.mark.vllm,
              pytest.mark.skipif(not os.path.isfile(os.path.join(MODEL, "config.json")),
                                 reason="set HYBRIDFLOW_SMOLLM2_DIR (.ci/model.sh)")]
TP = 3
LAYOUT = ("runtime.name=ray", f"placement.pools.main.devices_per_node={TP}",
          f"placement.parallel.actor.tp={TP}", "actor.strategy=fsdp2")


def _cfg() -> dict:
    from tests.support.workers import make_cfg
    cfg = make_cfg(actor={"strategy": "fsdp2", "mini_batch_size": 4, "micro_batch_size": 2})
    cfg["model"] = {"path": MODEL, "tokenizer": "auto", "device": "cpu", "dtype": "float32"}
    return cfg


def _rank(rank: int, world: int, port: int, batch, out_dir: str) -> None:
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    from hybridflow.workers import ActorWorker, WorkerContext
    from tests.support.workers import leave_process_group
    ctx = WorkerContext(rank=rank, world_size=world, local_rank=rank, device="cpu", tp=world)
    actor = ActorWorker(_cfg(), ctx)
    q = actor.module.model.layers[0].self_attn.q_proj.weight
    out = {"logp": actor.logprob(batch)["old_log_probs"],
           "q_rows": q.to_local().shape[0] if hasattr(q, "to_local") else q.shape[0]}
    torch.save(out, os.path.join(out_dir, f"rank{rank}.pt"))
    leave_process_group(rank, out_dir)


def test_check_accepts_the_real_model_at_tp3_with_the_workers_plan(capsys):
    code = main(["check", graph_path("grpo.py"), f"model.path={MODEL}", "model.tokenizer=auto",
                 *LAYOUT])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert f"layout: actor on pool main: dp 1 x sp 1 x tp {TP}, tp groups [[0, 1, 2]]" in out


def test_the_actor_builds_at_tp3_and_one_forward_is_one_ranks(tmp_path):
    import torch.multiprocessing as mp

    from hybridflow.workers import ActorWorker
    from tests.support.workers import rollout_for_update
    actor = ActorWorker(_cfg())
    batch = rollout_for_update(actor, prompts=["1+2=", "7*8="], n=1)
    single = actor.logprob(batch)["old_log_probs"]
    del actor
    mp.spawn(_rank, args=(TP, free_port(), batch, str(tmp_path)), nprocs=TP, join=True)
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(TP)]
    mask = batch["response_mask"].bool()
    assert mask.sum() > 0
    for rank in ranks:
        assert rank["q_rows"] == 576 // TP  # the projections really are sharded
        diff = (rank["logp"] - single)[mask].abs().max()
        assert diff < 1e-4, f"max |diff| {diff:.2e}"
