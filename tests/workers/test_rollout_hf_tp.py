"""A `rollout` role on a pool of its own at tp=2 with the `hf` engine (two gloo ranks)
holds only its shard of the model (built shard by shard from the toy safetensors
directory), loads each rank's part of new full weights (what the weight sync sends),
and then generates what one unsharded engine with the same weights generates: greedy
tokens equal, their log-probs within 1e-5, sampled tokens equal over the group."""
import os

import pytest
import torch
import torch.multiprocessing as mp

from tests.support.workers import leave_process_group, make_cfg, prompt_batch
from tests.support.ports import free_port
from hybridflow.workers import WorkerContext
from hybridflow.workers.models import model_bytes
from hybridflow.workers.rollout.worker import RolloutWorker
from hybridflow.workers.tokenizer import load_tokenizer

pytestmark = pytest.mark.slow  # two gloo ranks generate (~20 s)

TOY = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "graphs", "assets",
                                   "toy_base"))
CFG = make_cfg(model={"path": TOY, "hf_config": {}}, rollout={"max_new_tokens": 6})


def _new_weights() -> dict:
    """The toy's weights moved by seeded noise: what an update would send."""
    from safetensors.torch import load_file
    gen = torch.Generator().manual_seed(3)
    return {name: t + 0.05 * torch.randn(t.shape, generator=gen)
            for name, t in sorted(load_file(os.path.join(TOY, "model.safetensors")).items())}


def _run(weights: dict, ctx=None) -> dict:
    rollout = RolloutWorker(CFG, ctx)
    engine = rollout.engine
    engine.load_weights(weights.items())
    prompts = prompt_batch(load_tokenizer("char"), ["1+2=", "7*8=", "10+20="])
    greedy = rollout.generate(prompts, n=1, do_sample=False)
    torch.manual_seed(11)
    sampled = rollout.generate(prompts, n=2, do_sample=True)
    q = engine.module.model.layers[0].self_attn.q_proj.weight
    return {"greedy": greedy["responses"], "logp": greedy["rollout_log_probs"],
            "sampled": sampled["responses"], "bytes": model_bytes(engine.module),
            "q_rows": (q.to_local() if hasattr(q, "to_local") else q).shape[0],
            "shares": engine.shares_module}


def _rank_main(rank: int, world: int, port: int, weights: dict, out_dir: str):
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    ctx = WorkerContext(rank=rank, world_size=world, local_rank=rank, device="cpu", tp=world)
    torch.save(_run(weights, ctx), os.path.join(out_dir, f"rank{rank}.pt"))
    leave_process_group(rank, out_dir)


def test_an_own_pool_hf_rollout_at_tp2_holds_a_shard_and_generates_as_one(tmp_path):
    torch.set_num_threads(1)
    weights = _new_weights()
    single = _run(weights)
    mp.spawn(_rank_main, args=(2, free_port(), weights, str(tmp_path)), nprocs=2, join=True)
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(2)]
    for out in ranks:
        assert not out["shares"]
        assert out["q_rows"] * 2 == single["q_rows"]
        assert out["bytes"] < 0.6 * single["bytes"]  # half, norms whole
        assert torch.equal(out["greedy"], single["greedy"])
        assert torch.allclose(out["logp"], single["logp"], atol=1e-5, rtol=0)
    assert torch.equal(ranks[0]["sampled"], ranks[1]["sampled"])


def test_a_weight_of_another_shape_is_refused_naming_it():
    rollout = RolloutWorker(CFG)
    weights = _new_weights()
    name = "model.layers.0.mlp.up_proj.weight"
    weights[name] = torch.zeros(3, 3)
    with pytest.raises(ValueError, match=f"{name}.*shape"):
        rollout.engine.load_weights(weights.items())
