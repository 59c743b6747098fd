"""A 2-D layout on the CPU: 4 gloo ranks as dp 2 x tp 2 (FSDP2 over "dp", DTensor tensor
parallelism over "tp"). Each tp group holds half of the global batch, as dispatch sends
it; the actor's log-probs, one update's weights and metrics, and greedy generation equal
one unsharded rank's on the whole batch (fp32, 1e-5)."""
import os

import pytest
import torch
import torch.multiprocessing as mp

from tests.support.workers import leave_process_group, make_cfg, prompt_batch
from tests.support.workers import ADAM_STEP_ATOL, rollout_for_update
from tests.support.ports import free_port
from hybridflow.workers import ActorWorker, WorkerContext

pytestmark = pytest.mark.slow  # four gloo ranks on two cores (~60 s)

TOY = os.path.join(os.path.dirname(__file__), "..", "..", "graphs", "assets", "toy_base")
# lr 1e-3: see test_tensor_parallel.py (AdamW's first step is about lr * sign(g))
CFG = make_cfg(actor={"lr": 1e-3, "ppo_epochs": 1, "entropy_coeff": 0.01,
                      "use_kl_loss": True, "mini_batch_size": 8, "micro_batch_size": 2,
                      "strategy": "fsdp2"})
CFG["model"] = {**CFG["model"], "path": os.path.abspath(TOY), "hf_config": {}}
PROMPTS = ["1+2=", "7*8=", "10+20=", "99-1="]


def _run(batch, ctx=None) -> dict:
    actor = ActorWorker(CFG, ctx)
    prompts = prompt_batch(actor.tokenizer, PROMPTS)
    if ctx is not None:  # this tp group's rows, as dispatch sends them
        batch, prompts = batch.split(ctx.dp)[ctx.dp_rank], prompts.split(ctx.dp)[ctx.dp_rank]
    out = {"logprob": actor.logprob(batch, with_entropy=True),
           "greedy": actor.generate(prompts, n=1, do_sample=False)["responses"],
           "update": actor.update(batch).meta["metrics"],
           "weights": {n: (p.full_tensor() if hasattr(p, "full_tensor") else p).detach().clone()
                       for n, p in actor.module.named_parameters()},
           "fsdp": actor.trainer.fsdp}
    return out


def _rank_main(rank: int, world: int, port: int, batch, out_dir: str):
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    ctx = WorkerContext(rank=rank, world_size=world, local_rank=rank, device="cpu", tp=2)
    torch.save(_run(batch, ctx), os.path.join(out_dir, f"rank{rank}.pt"))
    leave_process_group(rank, out_dir)


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    torch.set_num_threads(1)
    out = tmp_path_factory.mktemp("tp2d")
    batch = rollout_for_update(ActorWorker(CFG), n=2)
    single = _run(batch)
    mp.spawn(_rank_main, args=(4, free_port(), batch, str(out)), nprocs=4, join=True)
    return batch, single, [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(4)]


def test_each_tp_group_scores_its_rows_like_one_rank(results):
    batch, single, ranks = results
    half = len(batch) // 2
    for rank, out in enumerate(ranks):
        rows = slice(0, half) if rank < 2 else slice(half, None)  # dp rank = rank // tp
        mine = out["logprob"]["old_log_probs"]
        assert torch.allclose(mine, single["logprob"]["old_log_probs"][rows], atol=1e-5, rtol=0)
        greedy = single["greedy"][slice(0, 2) if rank < 2 else slice(2, None)]
        assert torch.equal(out["greedy"], greedy)


def test_a_dp2_x_tp2_update_equals_one_rank(results):
    _, single, ranks = results
    assert all(out["fsdp"] for out in ranks)  # FSDP really shards over dp
    for out in ranks:
        assert set(out["weights"]) == set(single["weights"])
        for key, value in single["weights"].items():
            assert torch.allclose(out["weights"][key], value, atol=ADAM_STEP_ATOL, rtol=0), key
        for key in ("actor/pg_loss", "actor/kl_loss", "actor/entropy", "actor/grad_norm"):
            assert out["update"][key] == pytest.approx(single["update"][key],
                                                       rel=1e-5, abs=1e-6), key
