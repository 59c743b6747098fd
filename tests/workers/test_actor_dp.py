"""Data parallelism: one update on 2 gloo ranks equals the update on 1 rank with the
same global batch (global loss normalisers, DDP gradient averaging, uneven shards)."""
import os

import pytest
import torch
import torch.multiprocessing as mp

from tests.support.workers import (leave_process_group, make_cfg, ragged_responses,
                                   rollout_for_update)
from tests.support.ports import free_port
from hybridflow.workers import ActorWorker, WorkerContext

pytestmark = pytest.mark.slow  # two gloo ranks train a model (~15 s)

CONFIGS = {
    # two epochs (ratios move off 1, clipping active), KL loss and entropy bonus
    "token_mean": (make_cfg(actor={"lr": 1e-2, "ppo_epochs": 2, "use_kl_loss": True,
                                   "entropy_coeff": 0.01, "mini_batch_size": 8,
                                   "micro_batch_size": 2}), 8),
    # 7 rows -> shards of 4 and 3; micro 3 -> rank 1 runs a zero-loss dummy micro-batch
    "seq_mean_uneven": (make_cfg(actor={"lr": 1e-2, "loss_agg_mode": "seq-mean-token-mean",
                                        "mini_batch_size": 8, "micro_batch_size": 3}), 7),
    # ragged rows under a token budget: rank 0 cuts 3 micro-batches, rank 1 cuts 2 and
    # runs a dummy; the single rank groups the 8 rows differently again
    "token_budget": (make_cfg(actor={"lr": 1e-2, "mini_batch_size": 8, "micro_batch_size": 2,
                                     "max_tokens_per_micro_batch": 20}), 8),
    # packed sequences under a real-token budget: the ranks pack their own shards
    "packed_budget": (make_cfg(model={"use_remove_padding": True},
                               actor={"lr": 1e-2, "mini_batch_size": 8, "micro_batch_size": 2,
                                      "max_tokens_per_micro_batch": 30}), 8),
}
RAGGED = {"token_budget": [6, 1, 2, 6, 3, 1, 5, 2], "packed_budget": [6, 1, 2, 6, 3, 1, 5, 2]}


def _rank_main(rank: int, world: int, port: int, batches: dict, out_dir: str):
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    ctx = WorkerContext(rank=rank, world_size=world, local_rank=rank, device="cpu")
    results = {}
    for name, (cfg, _) in CONFIGS.items():
        actor = ActorWorker(cfg, ctx)
        shard = batches[name].split(world)[rank]
        metrics = actor.update(shard).meta["metrics"]
        results[name] = ({k: v.detach().clone() for k, v in actor.module.state_dict().items()},
                         metrics)
    torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))
    leave_process_group(rank, out_dir)


def test_two_ranks_update_like_one_rank_on_the_global_batch(tmp_path):
    batches, single = {}, {}
    for name, (cfg, rows) in CONFIGS.items():
        actor = ActorWorker(cfg)
        data = rollout_for_update(actor, n=2).take(slice(0, rows))
        if name in RAGGED:
            data = ragged_responses(data, RAGGED[name], actor.tokenizer.pad_token_id)
        batches[name] = data
        metrics = actor.update(data).meta["metrics"]
        single[name] = (actor.module.state_dict(), metrics)
    mp.spawn(_rank_main, args=(2, free_port(), batches, str(tmp_path)), nprocs=2, join=True)
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(2)]
    for name in CONFIGS:
        weights, metrics = single[name]
        for rank in ranks:
            dp_weights, dp_metrics = rank[name]
            for key, value in weights.items():
                assert torch.allclose(dp_weights[key], value, atol=1e-5, rtol=0), (name, key)
            for key in ("actor/pg_loss", "actor/grad_norm", "actor/entropy", "actor/ppo_kl"):
                assert dp_metrics[key] == pytest.approx(metrics[key], rel=1e-4, abs=1e-6), \
                    (name, key)
