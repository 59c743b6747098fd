"""tp=3 over a vocabulary that 3 does not divide (80 tokens: shards of 27, 27 and 26, as
Qwen2's 151,936 over 3 ranks), with a tied head and 3 heads (SmolLM2's tp is 3): the
sharded actor's log-probs, entropy and one update equal one rank's (fp32, 1e-5)."""
import os

import pytest
import torch
import torch.multiprocessing as mp

from tests.support.workers import ADAM_STEP_ATOL, TINY, leave_process_group, make_cfg
from tests.support.workers import rollout_for_update
from tests.support.ports import free_port
from hybridflow.workers import ActorWorker, WorkerContext
from hybridflow.workers.sequences import forward_response

pytestmark = pytest.mark.slow  # three gloo ranks on two cores (~30 s)

CFG = make_cfg(actor={"lr": 1e-3, "ppo_epochs": 1, "entropy_coeff": 0.01,
                      "mini_batch_size": 8, "micro_batch_size": 4, "strategy": "fsdp2"},
               model={"hf_config": {**TINY, "hidden_size": 48, "intermediate_size": 96,
                                    "num_attention_heads": 3, "num_key_value_heads": 3,
                                    "tie_word_embeddings": True}})


def _run(batch, ctx=None) -> dict:
    actor = ActorWorker(CFG, ctx)
    logp, ent = forward_response(actor.module, batch, 1.0, with_entropy=True)
    embed = actor.module.get_input_embeddings().weight
    out = {"logp": logp.detach(), "entropy": ent.detach(),
           "rows": (embed.to_local() if hasattr(embed, "to_local") else embed).shape[0],
           "update": actor.update(batch).meta["metrics"]}
    out["weights"] = {n: (p.full_tensor() if hasattr(p, "full_tensor") else p).detach().clone()
                      for n, p in actor.module.named_parameters()}
    return out


def _rank_main(rank: int, world: int, port: int, batch, out_dir: str):
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    ctx = WorkerContext(rank=rank, world_size=world, local_rank=rank, device="cpu", tp=world)
    torch.save(_run(batch, ctx), os.path.join(out_dir, f"rank{rank}.pt"))
    leave_process_group(rank, out_dir)


def test_tp3_over_an_uneven_vocabulary_equals_one_rank(tmp_path):
    torch.set_num_threads(1)
    batch = rollout_for_update(ActorWorker(CFG), n=2)
    single = _run(batch)
    mp.spawn(_rank_main, args=(3, free_port(), batch, str(tmp_path)), nprocs=3, join=True)
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(3)]
    assert [out["rows"] for out in ranks] == [27, 27, 26]
    for out in ranks:
        for key in ("logp", "entropy"):
            assert torch.allclose(out[key], single[key], atol=1e-5, rtol=0), key
        for key, value in single["weights"].items():
            assert torch.allclose(out["weights"][key], value, atol=ADAM_STEP_ATOL, rtol=0), key
        assert out["update"]["actor/grad_norm"] == pytest.approx(
            single["update"]["actor/grad_norm"], rel=1e-5)
