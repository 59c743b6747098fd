"""Sharded checkpoints across tensor-parallel layouts (issue 30, item 5): a checkpoint
saved at one layout resumes at another and the run continues as it would have.

Two gloo ranks, a tiny Llama with a tied head and an odd vocabulary (81 rows: shards
of 41 and 40 at tp=2), AdamW with a warm-up (so the restored schedule shows in the
steps). For each pair (saved at A, resumed at B) in dp=2 -> dp=1 x tp=2,
dp=1 x tp=2 -> dp=2, tp=2 -> one rank, and (4 ranks: FSDP's Shard(0) over "dp" on
top of the tp plan's placements, 2-D DTensors) dp=2 x tp=2 -> one rank: one update at
A, save, then K more updates at A and, from the checkpoint, the same K at B. The K
losses agree to 1e-6 (the second one reads weights that the restored moments and
learning rate moved), as do the weights after them and the AdamW moments right after
the load. An old-format checkpoint is refused at tp=2 with both layouts."""
import os

import pytest
import torch
import torch.multiprocessing as mp

from tests.support.workers import TINY, leave_process_group, make_cfg, rollout_for_update
from tests.support.ports import free_port
from hybridflow.workers import ActorWorker, WorkerContext

pytestmark = pytest.mark.slow  # 2 and 4 gloo ranks train six actors (~60 CPU s)

CFG = make_cfg(actor={"lr": 1e-2, "ppo_epochs": 1, "mini_batch_size": 8,
                      "micro_batch_size": 2, "strategy": "fsdp2", "warmup_steps": 4},
               model={"hf_config": {**TINY, "tie_word_embeddings": True, "vocab_size": 81}})
LOSSES = ("actor/pg_loss", "actor/grad_norm")
K = 2  # updates after the save: the first reads the restored weights, the second
#        the step the restored moments and schedule made


def _whole(t: torch.Tensor) -> torch.Tensor:
    return (t.full_tensor() if hasattr(t, "full_tensor") else t).detach().clone()


def _moments(actor) -> dict:
    """AdamW's state per parameter name, whole (a collective on sharded tensors)."""
    state = actor.trainer.optimizer.state
    return {f"{name}:{key}": _whole(value).reshape(-1)
            for name, param in actor.module.named_parameters() if param in state
            for key, value in sorted(state[param].items())}


def _continue(actor, batch) -> dict:
    losses = []
    for _ in range(K):
        metrics = actor.update(batch).meta["metrics"]
        losses.append({k: metrics[k] for k in LOSSES})
    return {"losses": losses, "lr": actor.trainer.scheduler.get_last_lr(),
            "weights": {n: _whole(p) for n, p in actor.module.named_parameters()}}


def _save_and_continue(actor, batch, directory: str) -> dict:
    actor.update(batch)
    actor.save_checkpoint(directory)
    return {"moments": _moments(actor), **_continue(actor, batch)}


def _resume_and_continue(actor, batch, directory: str) -> dict:
    actor.load_checkpoint(directory)
    return {"moments": _moments(actor), **_continue(actor, batch)}


def _old_format_at_tp2(actor, tp2, directory: str) -> str:
    """Save `actor` (dp=2) in the format from before DCP and load it at dp=1 x tp=2:
    the error's text (the same world size: only the layout can refuse it)."""
    actor.trainer.save(directory, actor.ctx.rank)
    try:
        ActorWorker(CFG, tp2).load_checkpoint(directory)
    except ValueError as err:
        return str(err)
    return "loaded"


def _rank_main(rank: int, world: int, port: int, batch, out_dir: str):
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dp2 = WorkerContext(rank=rank, world_size=world, local_rank=rank, device="cpu")
    tp2 = WorkerContext(rank=rank, world_size=world, local_rank=rank, device="cpu", tp=world)
    shard = batch.split(world)[rank]  # dp=2: this rank's rows; tp=2: the group's (all)
    at_dp2, at_tp2 = os.path.join(out_dir, "dp2"), os.path.join(out_dir, "tp2")
    out = {"dp2": _save_and_continue(ActorWorker(CFG, dp2), shard, at_dp2)}
    out["dp2->tp2"] = _resume_and_continue(ActorWorker(CFG, tp2), batch, at_dp2)
    out["tp2"] = _save_and_continue(ActorWorker(CFG, tp2), batch, at_tp2)
    resumed = ActorWorker(CFG, dp2)
    out["tp2->dp2"] = _resume_and_continue(resumed, shard, at_tp2)
    out["old_at_tp2"] = _old_format_at_tp2(resumed, tp2, os.path.join(out_dir, "old"))
    if rank == 0:
        torch.save(out, os.path.join(out_dir, "rank0.pt"))
    leave_process_group(rank, out_dir)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    torch.set_num_threads(1)
    out = tmp_path_factory.mktemp("ckpt_tp")
    batch = rollout_for_update(ActorWorker(CFG), n=2)
    mp.spawn(_rank_main, args=(2, free_port(), batch, str(out)), nprocs=2, join=True)
    runs = torch.load(out / "rank0.pt", weights_only=False)
    runs["tp2->1"] = _resume_and_continue(ActorWorker(CFG), batch, str(out / "tp2"))
    return runs


def _rank_main_2d(rank: int, world: int, port: int, batch, out_dir: str):
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    ctx = WorkerContext(rank=rank, world_size=world, local_rank=rank, device="cpu", tp=2)
    rows = batch.split(ctx.dp)[ctx.dp_rank]  # this tp group's rows, as dispatch sends them
    out = _save_and_continue(ActorWorker(CFG, ctx), rows, os.path.join(out_dir, "dp2xtp2"))
    if rank == 0:
        torch.save(out, os.path.join(out_dir, "rank0.pt"))
    leave_process_group(rank, out_dir)


@pytest.fixture(scope="module")
def runs_2d(tmp_path_factory):
    torch.set_num_threads(1)
    out = tmp_path_factory.mktemp("ckpt_2d")
    batch = rollout_for_update(ActorWorker(CFG), n=2)
    mp.spawn(_rank_main_2d, args=(4, free_port(), batch, str(out)), nprocs=4, join=True)
    saved = torch.load(out / "rank0.pt", weights_only=False)
    return saved, _resume_and_continue(ActorWorker(CFG), batch, str(out / "dp2xtp2"))


def _same_run(saved: dict, resumed: dict) -> float:
    """Assert the resumed run continues the saved one; the largest loss difference."""
    assert set(resumed["moments"]) == set(saved["moments"]) and saved["moments"]
    for key, value in saved["moments"].items():  # exp_avg, exp_avg_sq, step
        assert torch.allclose(resumed["moments"][key], value, atol=1e-7, rtol=1e-5), key
    worst = 0.0
    for step, (mine, theirs) in enumerate(zip(resumed["losses"], saved["losses"])):
        for key in LOSSES:
            assert mine[key] == pytest.approx(theirs[key], abs=1e-6), (step, key)
            worst = max(worst, abs(mine[key] - theirs[key]))
    assert resumed["lr"] == pytest.approx(saved["lr"], rel=1e-12)  # the schedule went on
    for key, value in saved["weights"].items():
        assert torch.allclose(resumed["weights"][key], value, atol=1e-5, rtol=0), key
    return worst


@pytest.mark.parametrize("saved,resumed", [("dp2", "dp2->tp2"), ("tp2", "tp2->dp2"),
                                           ("tp2", "tp2->1")])
def test_a_checkpoint_resumes_onto_another_tensor_parallel_layout(runs, saved, resumed):
    worst = _same_run(runs[saved], runs[resumed])
    print(f"{resumed}: max |loss difference| over {K} updates = {worst:.2e}")


def test_a_dp2_x_tp2_checkpoint_resumes_on_one_rank(runs_2d):
    worst = _same_run(*runs_2d)
    print(f"dp2xtp2->1: max |loss difference| over {K} updates = {worst:.2e}")


def test_the_layouts_train_alike_before_any_checkpoint(runs):
    """dp=2 and tp=2 from the same initial weights make the same first update, so the
    comparisons above are between two runs of one model (not two different ones)."""
    for step in range(K):
        for key in LOSSES:
            assert runs["dp2"]["losses"][step][key] == pytest.approx(
                runs["tp2"]["losses"][step][key], abs=1e-5)


def test_an_old_checkpoint_is_refused_at_another_tensor_parallel_layout(runs):
    """The format from before DCP (model.safetensors + one optim_rank<r>.pt per rank,
    saved at dp=2) at dp=1 x tp=2: the same two ranks, and refused by its layout."""
    refusal = runs["old_at_tp2"]
    assert "old' is in the format from before sharded checkpoints" in refusal  # names it
    assert "2 optim_rank<r>.pt files" in refusal
    assert "saved at dp=2 x tp=1, and this role runs dp=1 x tp=2" in refusal
    assert "placement.parallel.<role>.dp=2 tp=1" in refusal  # what to do
