"""Sequence parallelism composed with the other dimensions on 4 gloo ranks, against one
rank (sp=1, tp=1) on the whole batch, fp32: dp 2 x sp 2 (padded under DDP, packed under
FSDP2, and LoRA adapters under DDP) and sp 2 x tp 2 (FSDP2 over the sp ranks, the
DTensor plan over tp, Ulysses exchanging each rank's heads/tp heads over sp; padded and
packed) on a model with 8 heads and 4 key/value heads. Each row group gets its dp
slot's rows, as dispatch sends them, on a batch whose width is odd (padded to sp). The
log-prob pass, a training forward's log-probs and entropy, and the weights, losses and
gradient norm after one update equal one rank's to 1e-5, and so do whole logits gathered
along the sequence (under tp a DTensor still sharded on the vocabulary); each rank's
inner attention sees heads / (sp x tp) query and key/value heads over the whole row; a
checkpoint saved on the 4 ranks resumes on one (sp=1, tp=1: DCP reshards, the
parameters and AdamW moments replicate over sp) and its next update equals one rank's
second. A long prompt leaves rank 0's slice no response position under tp."""
import os
from contextlib import contextmanager

import pytest
import torch
import torch.multiprocessing as mp

from tests.support.workers import TINY, leave_process_group, long_prompt, make_cfg, odd_width
from tests.support.workers import rollout_for_update
from tests.support.ports import free_port
from hybridflow.core.dtensor import whole_tensor
from hybridflow.workers import ActorWorker, WorkerContext
from hybridflow.workers.parallel import ulysses
from hybridflow.workers.parallel.sequence_parallel import sequence_parallel
from hybridflow.workers.sequences import forward_response

pytestmark = pytest.mark.slow  # four gloo ranks build and train five models

TRAIN = {"lr": 1e-3, "ppo_epochs": 1, "entropy_coeff": 0.01, "use_kl_loss": True,
         "mini_batch_size": 8, "micro_batch_size": 2}
# sp x tp = 4 divides both head counts: each rank attends with 2 heads and 1 kv head
HEADS_8 = {**TINY, "num_attention_heads": 8, "num_key_value_heads": 4}


def _cfg(strategy: str, packed: bool, model: dict = TINY, **actor) -> dict:
    cfg = make_cfg(actor={**TRAIN, "strategy": strategy, **actor})
    cfg["model"] = {**cfg["model"], "hf_config": dict(model), "use_remove_padding": packed}
    return cfg


# name -> ((sp, tp), config); dp = 4 / (sp x tp)
CASES = {
    "dp2_sp2_padded_ddp": ((2, 1), _cfg("ddp", False)),
    "dp2_sp2_packed_fsdp2": ((2, 1), _cfg("fsdp2", True)),
    "dp2_sp2_lora_ddp": ((2, 1), _cfg("ddp", False, lora={"rank": 4, "alpha": 8})),
    "sp2_tp2_padded_fsdp2": ((2, 2), _cfg("fsdp2", False, HEADS_8)),
    "sp2_tp2_packed_fsdp2": ((2, 2), _cfg("fsdp2", True, HEADS_8)),
    # 8 more left-padding columns: rank 0's half of the row predicts no response token,
    # so its vocabulary-sharded head reduces no position
    "sp2_tp2_long_prompt_fsdp2": ((2, 2), _cfg("fsdp2", False, HEADS_8)),
}
INPUTS = ("input_ids", "attention_mask", "position_ids")
METRICS = ("actor/pg_loss", "actor/kl_loss", "actor/entropy", "actor/grad_norm")


def _full(tensor: torch.Tensor) -> torch.Tensor:
    return (tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor).detach().clone()


@contextmanager
def _attended(seen: list):
    """Record the (query heads, key/value heads, positions) each inner attention gets."""
    real = ulysses._inner_function

    def recording(module, inner):
        attend = real(module, inner)

        def attention(module, query, key, *args, **kwargs):
            seen.append((query.shape[1], key.shape[1], query.shape[2]))
            return attend(module, query, key, *args, **kwargs)
        return attention
    ulysses._inner_function = recording
    try:
        yield seen
    finally:
        ulysses._inner_function = real


def _run(cfg: dict, batch, ctx=None, checkpoint: str | None = None) -> dict:
    actor = ActorWorker(cfg, ctx)
    if ctx is not None:  # this row group's rows, as dispatch sends them
        batch = batch.split(ctx.dp)[ctx.dp_rank]
    module, packed = actor.module, cfg["model"]["use_remove_padding"]
    with _attended([]) as seen:
        out = {"pass": actor.logprob(batch)["old_log_probs"], "attended": seen}
    with sequence_parallel(module, actor.ctx), torch.no_grad():
        out["train"] = forward_response(module, batch, 0.7, with_entropy=True, packed=packed)
        if not packed:  # whole logits, gathered along the sequence (under tp: a DTensor)
            logits = module(**{k: batch[k] for k in INPUTS}).logits
            out["logits"] = (type(logits).__name__, whole_tensor(logits))
    out["update"] = actor.update(batch).meta["metrics"]
    out["weights"] = {n: _full(p) for n, p in module.named_parameters()}
    out["fsdp"] = actor.trainer.fsdp
    if checkpoint:
        actor.save_checkpoint(checkpoint)
    else:  # one rank: a second update, what a run resumed from the 4 ranks must reach
        actor.update(batch)
        out["second"] = {n: _full(p) for n, p in module.named_parameters()}
    return out


def _rank_main(rank: int, world: int, port: int, batches: dict, out_dir: str):
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    results = {}
    for name, ((sp, tp), cfg) in CASES.items():
        ctx = WorkerContext(rank=rank, world_size=world, local_rank=rank, device="cpu",
                            sp=sp, tp=tp)
        results[name] = _run(cfg, batches[name], ctx, os.path.join(out_dir, f"ckpt_{name}"))
    torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))
    leave_process_group(rank, out_dir)


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    torch.set_num_threads(1)
    out = tmp_path_factory.mktemp("sequence_parallel_2d")
    batches = {name: odd_width(rollout_for_update(ActorWorker(cfg), n=2))
               for name, (_, cfg) in CASES.items()}
    batches = {name: long_prompt(b) if "long_prompt" in name else b
               for name, b in batches.items()}
    single = {name: _run(cfg, batches[name]) for name, (_, cfg) in CASES.items()}
    mp.spawn(_rank_main, args=(4, free_port(), batches, str(out)), nprocs=4, join=True)
    ranks = [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(4)]
    for name, (_, cfg) in CASES.items():  # one rank, sp=1 tp=1, from the 4 ranks' save
        actor = ActorWorker(cfg)
        actor.load_checkpoint(str(out / f"ckpt_{name}"))
        ranks[0][name]["resumed"] = {n: _full(p) for n, p in actor.module.named_parameters()}
        actor.update(batches[name])
        ranks[0][name]["resumed_update"] = {n: _full(p) for n, p in
                                            actor.module.named_parameters()}
    return batches, single, ranks


def _rows(name: str, rank: int, total: int) -> slice:
    """The rows of `rank`'s dp slot (rank = (dp * sp + sp_rank) * tp + tp_rank)."""
    (sp, tp), _ = CASES[name]
    dp = 4 // (sp * tp)
    per = total // dp
    slot = rank // (sp * tp)
    return slice(slot * per, (slot + 1) * per)


def _close(a, b, what: str, atol: float = 1e-5):
    assert a.shape == b.shape, what
    assert torch.allclose(a, b, atol=atol, rtol=0), f"{what}: {(a - b).abs().max()}"


@pytest.mark.parametrize("name", list(CASES))
def test_log_probs_and_entropy_equal_one_rank(results, name):
    batches, single, ranks = results
    width, response = batches[name]["input_ids"].shape[1], batches[name]["responses"].shape[1]
    assert width % 2 == 1  # the split pads the row
    if "long_prompt" in name:  # rank 0's slice [0, (width + 1) / 2) predicts none
        assert width - response - 1 >= (width + 1) // 2
    want = single[name]
    for rank, out in enumerate(ranks):
        rows = _rows(name, rank, len(batches[name]))
        got = out[name]
        _close(got["pass"], want["pass"][rows], f"{name} rank {rank}: log-prob pass")
        for i, what in enumerate(("log-probs", "entropy")):
            _close(got["train"][i], want["train"][i][rows], f"{name} rank {rank}: {what}")


@pytest.mark.parametrize("name", [n for n in CASES if "padded" in n])
def test_whole_logits_gathered_along_the_sequence_equal_one_rank(results, name):
    batches, single, ranks = results
    (_, tp), _ = CASES[name]
    for rank, out in enumerate(ranks):
        kind, logits = out[name]["logits"]
        assert kind == ("DTensor" if tp > 1 else "Tensor"), (name, kind)  # vocab-sharded
        rows = _rows(name, rank, len(batches[name]))
        _close(logits, single[name]["logits"][1][rows], f"{name} rank {rank}: logits")


@pytest.mark.parametrize("name", list(CASES))
def test_each_rank_attends_its_share_of_heads_over_the_whole_row(results, name):
    batches, _, ranks = results
    (sp, tp), cfg = CASES[name]
    model = cfg["model"]["hf_config"]
    width = batches[name]["input_ids"].shape[1] + 1  # padded to a multiple of sp
    heads = (model["num_attention_heads"] // (sp * tp), model["num_key_value_heads"] // (sp * tp))
    for rank, out in enumerate(ranks):
        seen = out[name]["attended"]
        assert seen and {s[:2] for s in seen} == {heads}, (name, rank, set(seen))
        if not cfg["model"]["use_remove_padding"]:  # packed: the rows' real tokens
            assert {s[2] for s in seen} == {width}, (name, rank, set(seen))


@pytest.mark.parametrize("name", list(CASES))
def test_one_update_equals_one_rank(results, name):
    _, single, ranks = results
    want = single[name]
    before = ActorWorker(CASES[name][1]).module.state_dict()
    moved = [p for p, v in want["weights"].items() if not torch.equal(v, before[p])]
    assert moved, "the update changed no weight: the comparison would be empty"
    for rank, out in enumerate(ranks):
        got = out[name]
        assert got["weights"].keys() == want["weights"].keys()
        for param, value in want["weights"].items():
            _close(got["weights"][param], value, f"{name} rank {rank}: {param}")
        # the gradient norm shows a gradient scaled wrong (AdamW's first step would not)
        for key in METRICS:
            assert got["update"][key] == pytest.approx(want["update"][key], rel=1e-5,
                                                       abs=1e-6), (name, rank, key)
    if CASES[name][1]["actor"]["strategy"] == "fsdp2":
        assert all(out[name]["fsdp"] for out in ranks)  # FSDP2 shards over dp x sp


@pytest.mark.parametrize("name", list(CASES))
def test_a_checkpoint_saved_on_the_4_ranks_resumes_on_one(results, name):
    _, single, ranks = results
    got = ranks[0][name]
    for param, value in got["weights"].items():
        _close(got["resumed"][param], value, f"{name}: loaded {param}", atol=0)
    for param, value in single[name]["second"].items():
        _close(got["resumed_update"][param], value, f"{name}: second update {param}")


def test_lora_trains_only_its_adapters_under_sp(results):
    _, single, ranks = results
    name = "dp2_sp2_lora_ddp"
    before = ActorWorker(CASES[name][1]).module.state_dict()
    moved = {p for p, v in single[name]["weights"].items() if not torch.equal(v, before[p])}
    assert moved and all("lora_" in p for p in moved), sorted(moved)
    for out in ranks:
        changed = {p for p, v in out[name]["weights"].items() if not torch.equal(v, before[p])}
        assert changed == moved
