"""Sequence parallelism (workers/parallel/sequence_parallel.py) on 2 gloo ranks at
dp 1 x sp 2 against one rank (sp=1), on the tiny Llama (4 heads, 2 key/value heads),
padded (ddp), packed (fsdp2), padded with chunked log-probs (a chunk of 4 of a
slice's positions) and padded with a prompt longer than half the row (rank 0's slice
predicts no response token: its log-probs are the other rank's, its gradient reaches
the head through an empty slice), each on a batch whose width is odd (padded to sp):
the log-prob pass, a training forward's log-probs and entropy (and its gradients summed
over the sp ranks), and the weights after one update equal one rank's to 1e-5 (fp32);
no rank gathers the logits along the sequence in those passes (each reduces its own
slice's positions); a checkpoint saved at sp=2 resumes at sp=1 (DCP: parameters and
optimizer state replicate over sp), its next update equal to one rank's two."""
import os
from contextlib import contextmanager

import pytest
import torch
import torch.multiprocessing as mp

from tests.support.workers import leave_process_group, long_prompt, make_cfg, odd_width
from tests.support.workers import rollout_for_update
from tests.support.ports import free_port
from hybridflow.workers import ActorWorker, WorkerContext
from hybridflow.workers.parallel.sequence_parallel import sequence_parallel
from hybridflow.workers.sequences import forward_response

pytestmark = pytest.mark.slow  # two gloo ranks build and train four models (~30 s)

TRAIN = {"lr": 1e-3, "mini_batch_size": 8, "micro_batch_size": 4}


def _cfg(packed: bool, strategy: str, chunk: int | None = None) -> dict:
    cfg = make_cfg(actor={**TRAIN, "strategy": strategy, "logprob_chunk": chunk})
    cfg["model"] = {**cfg["model"], "use_remove_padding": packed}
    return cfg


CASES = {"padded_ddp": _cfg(False, "ddp"), "packed_fsdp2": _cfg(True, "fsdp2"),
         "chunked_padded_ddp": _cfg(False, "ddp", chunk=4),
         "long_prompt_ddp": _cfg(False, "ddp")}


def _batch(name: str, cfg: dict):
    batch = odd_width(rollout_for_update(ActorWorker(cfg), n=2))
    return long_prompt(batch) if name.startswith("long_prompt") else batch


def _weights(module) -> dict:
    state = {n: (p.full_tensor() if hasattr(p, "full_tensor") else p).detach().clone()
             for n, p in module.named_parameters()}
    return state


@contextmanager
def _counting(counts: dict):
    """Count the logits' gathers along the sequence and the chunked reductions."""
    import hybridflow.workers.parallel.sequence_parallel as sp_module
    import hybridflow.workers.sequences as sequences
    gather, chunked = sp_module.gather_sequence, sequences.chunked_token_stats

    def counted(name, real):
        return lambda *a, **k: counts.__setitem__(name, counts[name] + 1) or real(*a, **k)
    sp_module.gather_sequence = counted("gathers", gather)
    sequences.chunked_token_stats = counted("chunked", chunked)
    try:
        yield counts
    finally:
        sp_module.gather_sequence, sequences.chunked_token_stats = gather, chunked


def _train_forward(actor, batch, packed: bool, chunk: int | None):
    module = actor.module
    module.zero_grad(set_to_none=True)
    with sequence_parallel(module, actor.ctx):
        logp, ent = forward_response(module, batch, 0.7, with_entropy=True, packed=packed,
                                     logprob_chunk=chunk)
    mask = batch["response_mask"].float()
    (((logp + 0.1 * ent) * mask).sum() / mask.sum()).backward()
    grads = {n: (p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad).clone()
             for n, p in module.named_parameters() if p.grad is not None}
    module.zero_grad(set_to_none=True)
    return logp.detach(), ent.detach(), grads


def _run(cfg: dict, batch, ctx=None, checkpoint: str | None = None) -> dict:
    actor, packed = ActorWorker(cfg, ctx), cfg["model"]["use_remove_padding"]
    with _counting({"gathers": 0, "chunked": 0}) as counts:
        out = {"pass": actor.logprob(batch)["old_log_probs"],
               "train": _train_forward(actor, batch, packed, cfg["actor"]["logprob_chunk"])}
        actor.update(batch)
    out["counts"] = counts
    out["weights"] = _weights(actor.module)
    if checkpoint:
        actor.save_checkpoint(checkpoint)
    else:  # one rank: a second update, what the resumed run must reach
        actor.update(batch)
        out["second"] = _weights(actor.module)
    return out


def _rank_main(rank: int, world: int, port: int, batches: dict, out_dir: str):
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    results = {}
    for name, cfg in CASES.items():
        ctx = WorkerContext(rank=rank, world_size=world, local_rank=rank, device="cpu", sp=2)
        results[name] = _run(cfg, batches[name], ctx, os.path.join(out_dir, f"ckpt_{name}"))
    torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))
    leave_process_group(rank, out_dir)


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    torch.set_num_threads(1)
    out = tmp_path_factory.mktemp("sequence_parallel")
    batches = {name: _batch(name, cfg) for name, cfg in CASES.items()}
    single = {name: _run(cfg, batches[name]) for name, cfg in CASES.items()}
    mp.spawn(_rank_main, args=(2, free_port(), batches, str(out)), nprocs=2, join=True)
    ranks = [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(2)]
    resumed = {}
    for name, cfg in CASES.items():  # sp=1, one rank, from the sp=2 checkpoint
        actor = ActorWorker(cfg)
        actor.load_checkpoint(str(out / f"ckpt_{name}"))
        loaded = _weights(actor.module)
        actor.update(batches[name])
        resumed[name] = (loaded, _weights(actor.module))
    return batches, single, ranks, resumed


def _close(a, b, what: str, atol: float = 1e-5):
    assert a.shape == b.shape, what
    assert torch.allclose(a, b, atol=atol, rtol=0), f"{what}: {(a - b).abs().max()}"


@pytest.mark.parametrize("name", list(CASES))
def test_sp2_log_probs_entropy_and_gradients_equal_one_rank(results, name):
    batches, single, ranks, _ = results
    width, response = batches[name]["input_ids"].shape[1], batches[name]["responses"].shape[1]
    assert width % 2 == 1  # the split pads the row
    if name.startswith("long_prompt"):  # rank 0's slice [0, (width + 1) / 2) predicts none
        assert width - response - 1 >= (width + 1) // 2
    want = single[name]
    for rank, out in enumerate(ranks):
        got = out[name]
        _close(got["pass"], want["pass"], f"{name} rank {rank}: log-prob pass")
        for i, what in enumerate(("log-probs", "entropy")):
            _close(got["train"][i], want["train"][i], f"{name} rank {rank}: training {what}")
    # a rank's backward reaches its own positions: summed over the sp ranks (what the
    # data-parallel wrap over dp x sp does) it is one rank's gradient
    assert ranks[0][name]["train"][2].keys() == want["train"][2].keys()
    for param, grad in want["train"][2].items():
        summed = sum(out[name]["train"][2][param] for out in ranks)
        _close(summed, grad, f"{name}: gradient of {param} summed over the sp ranks")


@pytest.mark.parametrize("name", list(CASES))
def test_sp2_update_equals_one_rank(results, name):
    _, single, ranks, _ = results
    before = ActorWorker(CASES[name]).module.state_dict()
    for rank, out in enumerate(ranks):
        for param, value in single[name]["weights"].items():
            _close(out[name]["weights"][param], value, f"{name} rank {rank}: {param}")
    moved = [p for p, v in single[name]["weights"].items()
             if not torch.equal(v, before[p])]
    assert moved, "the update changed no weight: the comparison would be empty"


@pytest.mark.parametrize("name", list(CASES))
def test_sp2_checkpoint_resumes_at_sp1(results, name):
    _, single, ranks, resumed = results
    loaded, after = resumed[name]
    for param, value in ranks[0][name]["weights"].items():
        _close(loaded[param], value, f"{name}: loaded {param}", atol=0)
    for param, value in single[name]["second"].items():
        _close(after[param], value, f"{name}: second update {param}")


@pytest.mark.parametrize("name", list(CASES))
def test_sp2_passes_reduce_their_own_slice_never_gathering_logits(results, name):
    _, single, ranks, _ = results
    chunked = CASES[name]["actor"]["logprob_chunk"] is not None
    for rank, out in enumerate(ranks):
        assert out[name]["counts"]["gathers"] == 0, (name, rank, out[name]["counts"])
        # the log-prob pass, the training forward and the update's micro-batches chunk
        # their slice's positions (chunk 4 of about half a row's response positions)
        assert (out[name]["counts"]["chunked"] > 0) == chunked, (name, out[name]["counts"])
    assert (single[name]["counts"]["chunked"] > 0) == chunked
