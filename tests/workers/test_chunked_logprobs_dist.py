"""Chunked log-probs across ranks (2 gloo ranks): at tp=2, where the head is sharded on the
vocabulary and each chunk's log-probs and entropy are the vocab-parallel reductions
(workers/parallel/vocab_parallel.py), padded and packed, and under FSDP2 over dp=2, where the head
is applied to each chunk outside the root module's forward: the chunked log-probs, entropy
and gradients equal the same rank's unchunked ones to 1e-6 (fp32), in a training forward
and a log-prob pass, and one unsharded rank's to 1e-5 (the tensor-parallel tests' bound)."""
import os

import pytest
import torch
import torch.multiprocessing as mp

from tests.support.workers import QWEN2, leave_process_group, make_cfg, rollout_for_update
from tests.support.ports import free_port
from hybridflow.workers import ActorWorker, WorkerContext
from hybridflow.workers.sequences import forward_response, response_logprobs
from hybridflow.workers.parallel.vocab_parallel import is_vocab_sharded

pytestmark = pytest.mark.slow  # two gloo ranks build three models (~20 s)

CHUNK = 5
TRAIN = {"lr": 1e-3, "mini_batch_size": 8, "micro_batch_size": 4, "strategy": "fsdp2"}


def _cfg(packed: bool) -> dict:
    cfg = make_cfg(actor=TRAIN)
    cfg["model"] = {**cfg["model"], "hf_config": dict(QWEN2), "use_remove_padding": packed}
    return cfg


# name -> (config, tp of the two ranks' context)
CASES = {"tp2": (_cfg(False), 2), "tp2_packed": (_cfg(True), 2), "fsdp2_dp2": (_cfg(False), 1)}


def _whole(t: torch.Tensor) -> torch.Tensor:
    return (t.full_tensor() if hasattr(t, "full_tensor") else t).detach().clone()


def _train_forward(module, batch, chunk: int, packed: bool):
    """Log-probs, entropy and the gradients of a token-mean loss reading both."""
    module.zero_grad(set_to_none=True)
    logp, ent = forward_response(module, batch, 0.7, with_entropy=True, packed=packed,
                                 logprob_chunk=chunk)
    mask = batch["response_mask"].float()
    (((logp + 0.1 * ent) * mask).sum() / mask.sum()).backward()
    grads = {n: _whole(p.grad) for n, p in module.named_parameters() if p.grad is not None}
    module.zero_grad(set_to_none=True)
    return logp.detach(), ent.detach(), grads


def _run(cfg: dict, batch, ctx=None) -> dict:
    actor, packed = ActorWorker(cfg, ctx), cfg["model"]["use_remove_padding"]
    out = {}
    for chunk in (0, CHUNK):
        out[chunk] = {"train": _train_forward(actor.module, batch, chunk, packed),
                      "pass": response_logprobs(actor.module, batch, 4, actor.device, 0.7,
                                                with_entropy=True, packed=packed,
                                                logprob_chunk=chunk)}
    head = actor.module.get_output_embeddings()
    out["sharded_head"] = is_vocab_sharded(head(torch.zeros(1, head.in_features)))
    return out


def _rank_main(rank: int, world: int, port: int, batches: dict, out_dir: str):
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    results = {}
    for name, (cfg, tp) in CASES.items():
        ctx = WorkerContext(rank=rank, world_size=world, local_rank=rank, device="cpu", tp=tp)
        results[name] = _run(cfg, batches[name], ctx)
    torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))
    leave_process_group(rank, out_dir)


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    torch.set_num_threads(1)
    out = tmp_path_factory.mktemp("chunked")
    batches = {name: rollout_for_update(ActorWorker(cfg), n=2) for name, (cfg, _) in CASES.items()}
    single = {name: _run(cfg, batches[name]) for name, (cfg, _) in CASES.items()}
    mp.spawn(_rank_main, args=(2, free_port(), batches, str(out)), nprocs=2, join=True)
    ranks = [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(2)]
    return single, ranks


def _close(a: torch.Tensor, b: torch.Tensor, what: str, atol: float):
    assert a.shape == b.shape, what
    assert torch.allclose(a, b, atol=atol, rtol=0), f"{what}: {(a - b).abs().max()}"


def _compare(got: dict, want: dict, atol: float, where: str):
    for i, what in enumerate(("log-probs", "entropy")):
        _close(got["train"][i], want["train"][i], f"{where}: training {what}", atol)
        _close(got["pass"][i], want["pass"][i], f"{where}: log-prob pass {what}", atol)
    assert got["train"][2].keys() == want["train"][2].keys(), where
    for name, grad in want["train"][2].items():
        _close(got["train"][2][name], grad, f"{where}: gradient of {name}", atol)


@pytest.mark.parametrize("name", list(CASES))
def test_chunked_equals_unchunked_on_each_rank(results, name):
    _, ranks = results
    for rank, out in enumerate(ranks):
        _compare(out[name][CHUNK], out[name][0], 1e-6, f"{name} rank {rank}")


@pytest.mark.parametrize("name", list(CASES))
def test_chunked_on_two_ranks_equals_one_rank(results, name):
    single, ranks = results
    for rank, out in enumerate(ranks):
        _compare(out[name][CHUNK], single[name][0], 1e-5, f"{name} rank {rank}")


def test_the_tensor_parallel_head_is_vocab_sharded(results):
    _, ranks = results
    for out in ranks:
        assert out["tp2"]["sharded_head"] and out["tp2_packed"]["sharded_head"]
        assert not out["fsdp2_dp2"]["sharded_head"]
