"""FSDP2 on the CPU (`fully_shard` over a 2-process gloo mesh): an update on 2 sharded
ranks equals the update on 1 rank with the same global batch, a sharded checkpoint
resumes to the same weights an uninterrupted run reaches, and LoRA trains its
adapters under FSDP2 like on one rank, and the exported (merged) model is the same."""
import os

import pytest
import torch
import torch.multiprocessing as mp

from tests.support.workers import leave_process_group, make_cfg, rollout_for_update
from tests.support.ports import free_port
from hybridflow.workers import ActorWorker, WorkerContext

pytestmark = pytest.mark.slow  # two gloo ranks train three times (~30 s)

BASE = {"lr": 1e-2, "ppo_epochs": 2, "use_kl_loss": True, "entropy_coeff": 0.01,
        "mini_batch_size": 8, "micro_batch_size": 2}
CONFIGS = {
    "full": make_cfg(actor={**BASE, "strategy": "fsdp2"}),
    "lora": make_cfg(actor={**BASE, "strategy": "fsdp2", "lr": 5e-2,
                            "lora": {"rank": 4, "alpha": 8}}),
}


def _full_weights(actor) -> dict:
    return {k: v.clone() for k, v in actor.trainer.trained_weights().items()}


def _rank_main(rank: int, world: int, port: int, batch, out_dir: str):
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    ctx = WorkerContext(rank=rank, world_size=world, local_rank=rank, device="cpu")
    results = {}
    for name, cfg in CONFIGS.items():
        actor = ActorWorker(cfg, ctx)
        assert actor.trainer.fsdp  # parameters really are sharded
        shard = batch.split(world)[rank]
        metrics = actor.update(shard).meta["metrics"]
        results[name] = (_full_weights(actor), metrics)
        actor.export(os.path.join(out_dir, f"sharded_{name}"))  # every rank gathers
    # resume: save after one update, run a second, reload, run the second again
    actor = ActorWorker(CONFIGS["full"], ctx)
    shard = batch.split(world)[rank]
    actor.update(shard)
    actor.save_checkpoint(os.path.join(out_dir, "ckpt"))
    actor.update(shard)
    straight = _full_weights(actor)
    resumed = ActorWorker(CONFIGS["full"], ctx)
    resumed.load_checkpoint(os.path.join(out_dir, "ckpt"))
    resumed.update(shard)
    results["resume"] = (straight, _full_weights(resumed))
    if rank == 0:  # full weights are gathered on rank 0
        torch.save(results, os.path.join(out_dir, "rank0.pt"))
    leave_process_group(rank, out_dir)


@pytest.fixture(scope="module")
def fsdp_results(tmp_path_factory):
    out = tmp_path_factory.mktemp("fsdp2")
    single = {}
    batch = None
    for name, cfg in CONFIGS.items():
        actor = ActorWorker(cfg)  # one rank, no process group: the unsharded update
        assert not actor.trainer.fsdp
        batch = rollout_for_update(actor, n=2) if batch is None else batch
        metrics = actor.update(batch).meta["metrics"]
        single[name] = (_full_weights(actor), metrics)
        actor.export(str(out / f"single_{name}"))
    mp.spawn(_rank_main, args=(2, free_port(), batch, str(out)), nprocs=2, join=True)
    return single, torch.load(out / "rank0.pt", weights_only=False), out


@pytest.mark.parametrize("name", list(CONFIGS))
def test_two_sharded_ranks_update_like_one_rank(fsdp_results, name):
    single, sharded, _ = fsdp_results
    weights, metrics = single[name]
    dp_weights, dp_metrics = sharded[name]
    assert set(dp_weights) == set(weights)
    for key, value in weights.items():
        assert torch.allclose(dp_weights[key], value, atol=1e-5, rtol=0), key
    for key in ("actor/pg_loss", "actor/grad_norm", "actor/entropy", "actor/kl_loss"):
        assert dp_metrics[key] == pytest.approx(metrics[key], rel=1e-4, abs=1e-6), key
    if name == "lora":
        assert all("lora_" in key for key in weights)  # only the adapters trained


def test_sharded_checkpoint_resumes_to_the_uninterrupted_weights(fsdp_results):
    _, sharded, _ = fsdp_results
    straight, resumed = sharded["resume"]
    for key, value in straight.items():
        assert torch.equal(resumed[key], value), key


@pytest.mark.parametrize("name", list(CONFIGS))
def test_sharded_export_writes_the_single_rank_model(fsdp_results, name):
    from safetensors.torch import load_file
    _, _, out = fsdp_results
    single = load_file(out / f"single_{name}" / "model.safetensors")
    sharded = load_file(out / f"sharded_{name}" / "model.safetensors")
    assert set(sharded) == set(single) and not any("lora_" in k for k in single)
    for key, value in single.items():
        assert torch.allclose(sharded[key], value, atol=1e-5, rtol=0), key
