"""Sharded checkpoints (hybridflow/workers/parallel/sharded_checkpoint.py): every rank saves its
shards with DCP, and a checkpoint resumes onto another data-parallel layout: saved by
2 FSDP2 ranks and resumed on 1 (and back), the next update's loss and weights are the
uninterrupted run's. An old checkpoint (model.safetensors + optim_rank*.pt) still
loads at its world size and is refused, with what to do, at another."""
import os
import shutil

import pytest
import torch
import torch.multiprocessing as mp

from tests.support.workers import TINY, leave_process_group, make_cfg, rollout_for_update
from tests.support.ports import free_port
from hybridflow.workers import ActorWorker, WorkerContext
from hybridflow.workers.parallel.sharded_checkpoint import DCP_DIR, is_sharded_checkpoint

CFG = make_cfg(actor={"lr": 1e-2, "ppo_epochs": 1, "mini_batch_size": 8,
                      "micro_batch_size": 2, "strategy": "fsdp2"})
LOSSES = ("actor/pg_loss", "actor/grad_norm")


def _weights(actor) -> dict:
    return {k: v.clone() for k, v in actor.trainer.trained_weights().items()}


def _losses(out) -> dict:
    metrics = out.meta["metrics"]
    return {k: metrics[k] for k in LOSSES}


def _rank_main(rank: int, world: int, port: int, batch, out_dir: str):
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    ctx = WorkerContext(rank=rank, world_size=world, local_rank=rank, device="cpu")
    shard = batch.split(world)[rank]
    actor = ActorWorker(CFG, ctx)  # dp=2: update, save, update again
    assert actor.trainer.fsdp
    actor.update(shard)
    saved = _weights(actor)
    actor.save_checkpoint(os.path.join(out_dir, "saved_at_2"))
    second = _losses(actor.update(shard))
    straight = _weights(actor)
    resumed = ActorWorker(CFG, ctx)  # dp=2 resumes the checkpoint 1 rank saved
    resumed.load_checkpoint(os.path.join(out_dir, "saved_at_1"))
    from_one = _losses(resumed.update(shard))
    results = {"saved": saved, "second": second, "straight": straight, "from_one": from_one,
               "from_one_weights": _weights(resumed)}
    if rank == 0:  # full weights are gathered on rank 0
        torch.save(results, os.path.join(out_dir, "rank0.pt"))
    leave_process_group(rank, out_dir)


@pytest.mark.slow  # two gloo ranks, two updates each (~20 s)
def test_a_checkpoint_resumes_across_data_parallel_layouts(tmp_path):
    one = ActorWorker(CFG)  # dp=1
    batch = rollout_for_update(one, n=2)
    one.update(batch)
    one.save_checkpoint(str(tmp_path / "saved_at_1"))
    assert is_sharded_checkpoint(str(tmp_path / "saved_at_1"))
    one_second = _losses(one.update(batch))
    one_weights = _weights(one)
    mp.spawn(_rank_main, args=(2, free_port(), batch, str(tmp_path)), nprocs=2, join=True)
    two = torch.load(tmp_path / "rank0.pt", weights_only=False)
    shards = sorted(os.listdir(tmp_path / "saved_at_2" / DCP_DIR))
    assert shards == [".metadata", "__0_0.distcp", "__1_0.distcp"]  # per rank, no gather
    assert "model.safetensors" not in os.listdir(tmp_path / "saved_at_2")
    _exports_the_saved_weights(tmp_path / "saved_at_2", tmp_path / "hf", two["saved"])
    resumed = ActorWorker(CFG)  # dp=1 resumes the checkpoint 2 ranks saved
    resumed.load_checkpoint(str(tmp_path / "saved_at_2"))
    from_two = _losses(resumed.update(batch))
    for key in LOSSES:  # 2 ranks update like 1 rank, so all four runs agree
        assert from_two[key] == pytest.approx(two["second"][key], abs=1e-6), key
        assert two["from_one"][key] == pytest.approx(one_second[key], abs=1e-6), key
    for key, value in _weights(resumed).items():
        assert torch.allclose(two["straight"][key], value, atol=1e-5, rtol=0), key
        assert torch.allclose(two["from_one_weights"][key], one_weights[key],
                              atol=1e-5, rtol=0), key


def test_an_old_checkpoint_loads_at_its_world_size_and_is_refused_at_another(tmp_path):
    actor = ActorWorker(CFG)
    batch = rollout_for_update(actor, n=1)
    actor.update(batch)
    actor.trainer.save(str(tmp_path), 0)  # the format before DCP: full weights + optim
    assert set(os.listdir(tmp_path)) >= {"model.safetensors", "optim_rank0.pt"}
    resumed = ActorWorker(CFG)
    resumed.load_checkpoint(str(tmp_path))
    for key, value in _weights(actor).items():
        assert torch.equal(_weights(resumed)[key], value), key
    shutil.copy(tmp_path / "optim_rank0.pt", tmp_path / "optim_rank1.pt")  # saved by 2
    with pytest.raises(ValueError, match=r"2 optim_rank<r>.pt files.*Resume with 2 rank"):
        ActorWorker(CFG).load_checkpoint(str(tmp_path))


def test_a_checkpoint_of_another_model_is_refused_by_name(tmp_path):
    ActorWorker(CFG).save_checkpoint(str(tmp_path))
    other = ActorWorker(make_cfg(actor={"strategy": "fsdp2"},
                                 model={"hf_config": {**TINY, "num_hidden_layers": 3}}))
    with pytest.raises(ValueError, match=f"{tmp_path}.*does not fit"):
        other.load_checkpoint(str(tmp_path))


def _exports_the_saved_weights(role_dir, out, saved: dict):
    """The export of a checkpoint 2 ranks saved, read in one process bucket by bucket."""
    from transformers import AutoModelForCausalLM
    from hybridflow.workers.hf_export import write_checkpoint_weights
    write_checkpoint_weights(str(role_dir), str(out), bucket_bytes=4096, max_shard_bytes=30_000)
    shutil.copy(role_dir / "config.json", out)
    exported = AutoModelForCausalLM.from_pretrained(out).state_dict()
    for key, value in saved.items():
        assert torch.equal(exported[key], value), key


def test_a_critic_resumes_its_value_head_and_optimizer_from_its_shards(tmp_path):
    from hybridflow.workers import CriticWorker
    cfg = make_cfg(critic={"lr": 3e-3, "mini_batch_size": 8, "micro_batch_size": 4})
    data = rollout_for_update(ActorWorker(cfg), n=1).drop("values")
    data["returns"] = 0.7 * data["response_mask"].float()
    critic = CriticWorker(cfg)
    critic.update(data.union(critic.values(data)))
    critic.save_checkpoint(str(tmp_path))
    assert is_sharded_checkpoint(str(tmp_path))
    step = data.union(critic.values(data))
    after = critic.update(step).meta["metrics"]["critic/vf_loss"]
    resumed = CriticWorker(cfg)
    resumed.load_checkpoint(str(tmp_path))
    again = resumed.update(step).meta["metrics"]["critic/vf_loss"]
    assert again == pytest.approx(after, abs=1e-7)  # weights, moments and schedule back
    assert torch.equal(resumed.values(data)["values"], critic.values(data)["values"])
