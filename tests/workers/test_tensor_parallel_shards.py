"""A tensor-parallel role builds its model from a safetensors directory shard by shard
(`hybridflow/workers/parallel/shard_build.py`): at tp=2 (two gloo ranks) the actor's log-probs,
entropy and weights, the reference's log-probs and a critic's values (its value head new
to the causal-LM checkpoint) equal one unsharded rank's built by `from_pretrained`, for a
tied Llama saved as an index of several files and a Qwen2 (q/k/v biases) over a
vocabulary 2 does not divide; the rotary buffers are recomputed; a shard built in bf16
trains on float32 master weights; a directory whose
tensors do not match its config is refused naming them; and building a tp=2 shard
raises a rank's memory high-water mark by well under what building the whole model
does (VmHWM, reset by /proc/self/clear_refs, in fresh processes)."""
import json
import os

import pytest
import torch
import torch.multiprocessing as mp

from tests.support.workers import QWEN2, TINY, leave_process_group, make_cfg
from tests.support.workers import rollout_for_update
from tests.support.ports import free_port
from hybridflow.workers import ActorWorker, CriticWorker, ReferenceWorker, WorkerContext
from hybridflow.workers.models import ModelLoadError
from hybridflow.workers.sequences import forward_response

pytestmark = pytest.mark.slow  # three spawns of gloo ranks on two cores (~60 s)

MODELS = {  # saved whole by the parent, then read by each rank
    "tied_llama": ({**TINY, "tie_word_embeddings": True}, "20KB"),  # several files + index
    "qwen2_uneven": ({**QWEN2, "vocab_size": 81}, None),  # rows 41 + 40 per rank
}
TRAIN = {"lr": 1e-3, "mini_batch_size": 8, "micro_batch_size": 4, "strategy": "fsdp2"}
# big enough to dominate a rank's RSS growth: ~71 MB in float32, untied
BIG = {"hidden_size": 512, "intermediate_size": 1536, "num_hidden_layers": 3,
       "num_attention_heads": 8, "num_key_value_heads": 4, "model_type": "llama",
       "max_position_embeddings": 128, "tie_word_embeddings": False, "vocab_size": 8192}
MIB = 2**20


def _cfg(folder: str) -> dict:
    return make_cfg(actor=TRAIN, critic={**TRAIN, "path": folder},
                    model={"path": folder, "hf_config": {}})


def _save(folder: str, hf_config: dict, shard_size) -> None:
    cfg = make_cfg(model={"hf_config": hf_config})
    module = ActorWorker(cfg).module  # seeded from the config, whole
    module.save_pretrained(folder, **({"max_shard_size": shard_size} if shard_size else {}))


def _whole(t: torch.Tensor) -> torch.Tensor:
    return (t.full_tensor() if hasattr(t, "full_tensor") else t).detach().clone()


def _run(folder: str, batch, ctx=None) -> dict:
    cfg = _cfg(folder)
    actor = ActorWorker(cfg, ctx)
    module = actor.module
    logp, ent = forward_response(module, batch, 1.0, with_entropy=True)
    embed, head = module.get_input_embeddings(), module.get_output_embeddings()
    out = {"logp": logp.detach(), "entropy": ent.detach(),
           "ref": ReferenceWorker(cfg, ctx).logprob(batch)["ref_log_prob"],
           "values": CriticWorker(cfg, ctx).values(batch)["values"],
           "weights": {n: _whole(p) for n, p in module.named_parameters()},
           "inv_freq": module.model.rotary_emb.inv_freq.clone(),
           "tied": head.weight is embed.weight,
           "rows": (embed.weight.to_local() if hasattr(embed.weight, "to_local")
                    else embed.weight).shape[0]}
    return out


def _bf16_update(folder: str, batch, ctx=None) -> dict:
    """One update of an actor built in bf16: float32 master weights (a DTensor's local
    shard upcast too, not only its outer dtype), bf16 forwards."""
    cfg = _cfg(folder)
    cfg["model"]["dtype"] = "bf16"
    actor = ActorWorker(cfg, ctx)
    q = actor.module.model.layers[0].self_attn.q_proj.weight
    local = q.to_local() if hasattr(q, "to_local") else q
    return {"dtype": local.dtype, "metrics": actor.update(batch).meta["metrics"]}


def _refusal(folder: str, ctx) -> str:
    try:
        ActorWorker(_cfg(folder), ctx)
    except ModelLoadError as err:
        return str(err)
    return "built"


def _rank_main(rank: int, world: int, port: int, root: str, batches: dict):
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    ctx = WorkerContext(rank=rank, world_size=world, local_rank=rank, device="cpu", tp=world)
    results = {name: _run(os.path.join(root, name), batches[name], ctx) for name in MODELS}
    results["refusal"] = _refusal(os.path.join(root, "mismatched"), ctx)
    results["bf16"] = _bf16_update(os.path.join(root, "tied_llama"), batches["tied_llama"], ctx)
    torch.save(results, os.path.join(root, f"rank{rank}.pt"))
    leave_process_group(rank, root)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("shards")
    for name, (hf_config, shard_size) in MODELS.items():
        _save(str(root / name), hf_config, shard_size)
    _save(str(root / "mismatched"), TINY, None)
    config = json.loads((root / "mismatched" / "config.json").read_text())
    config["intermediate_size"] = 2 * config["intermediate_size"]  # not what was saved
    (root / "mismatched" / "config.json").write_text(json.dumps(config))
    batches = {name: rollout_for_update(ActorWorker(_cfg(str(root / name))), n=2)
               for name in MODELS}
    single = {name: _run(str(root / name), batches[name]) for name in MODELS}
    single["bf16"] = _bf16_update(str(root / "tied_llama"), batches["tied_llama"])
    mp.spawn(_rank_main, args=(2, free_port(), str(root), batches), nprocs=2, join=True)
    ranks = [torch.load(root / f"rank{r}.pt", weights_only=False) for r in range(2)]
    return root, single, ranks


def _close(a: torch.Tensor, b: torch.Tensor, what: str, atol: float = 1e-5):
    assert a.shape == b.shape, what
    assert torch.allclose(a, b, atol=atol, rtol=0), f"{what}: {(a - b).abs().max()}"


def test_the_index_splits_the_tied_checkpoint_into_files(built):
    root, _, _ = built
    index = json.loads((root / "tied_llama" / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1


@pytest.mark.parametrize("name", list(MODELS))
def test_shards_read_from_the_directory_equal_the_whole_model(built, name):
    """Weights (gathered), log-probs, entropy, the reference's log-probs and the critic's
    values (a value head the checkpoint does not hold, seeded as from_pretrained seeds
    it) at tp=2 equal one rank's; rotary inv_freq (not in the files) is recomputed."""
    _, single, ranks = built
    ref = single[name]
    for rank in ranks:
        out = rank[name]
        for key, value in ref["weights"].items():
            assert torch.equal(out["weights"][key], value), key
        for key in ("logp", "entropy", "ref", "values"):
            _close(out[key], ref[key], key)
        assert torch.equal(out["inv_freq"], ref["inv_freq"])
        assert out["tied"] == ref["tied"] == (name == "tied_llama")
    vocab = ref["weights"]["model.embed_tokens.weight"].shape[0]
    assert [rank[name]["rows"] for rank in ranks] == [(vocab + 1) // 2, vocab // 2]


def test_a_directory_that_does_not_match_its_config_is_refused_naming_tensors(built):
    _, _, ranks = built
    for rank in ranks:
        assert "mismatched" in rank["refusal"]
        assert "mlp.gate_proj.weight" in rank["refusal"]
        assert "tensor(s) of another shape" in rank["refusal"]


def test_a_bf16_shard_trains_on_float32_master_weights(built):
    """bf16 forwards: the losses agree with one rank's to bf16's precision, not 1e-5."""
    _, single, ranks = built
    for rank in ranks:
        assert rank["bf16"]["dtype"] == torch.float32
        for key in ("actor/pg_loss", "actor/grad_norm"):
            assert rank["bf16"]["metrics"][key] == pytest.approx(
                single["bf16"]["metrics"][key], rel=2e-2), key


# ------------------------------------------------------------------ memory
def _status(field: str) -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(field)


def _peak_rank(rank: int, world: int, port: int, folder: str, out_dir: str):
    """What building the model (and touching every weight, as any forward does: a
    whole model loaded by from_pretrained is memory-mapped until read) adds to this
    process's high-water mark, imports and the process group set up beforehand."""
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    from transformers import AutoModelForCausalLM
    from hybridflow.workers.config import ModelConfig
    from hybridflow.workers.models import build_causal_lm, model_bytes, role_tp_mesh
    from hybridflow.workers.parallel.shard_build import safetensors_files
    from hybridflow.workers.tokenizer import load_tokenizer
    ctx = WorkerContext(rank=rank, world_size=world, local_rank=rank, device="cpu", tp=world)
    mesh = role_tp_mesh(ctx)
    cfg, tokenizer = ModelConfig(path=folder, device="cpu"), load_tokenizer("char")
    AutoModelForCausalLM.from_config(TINY_LLAMA)  # the model code's imports, beforehand
    safetensors_files(folder)
    with open("/proc/self/clear_refs", "w") as fh:
        fh.write("5")  # VmHWM := VmRSS now
    base = _status("VmRSS")
    model = build_causal_lm(cfg, tokenizer, "cpu", 0, tp_mesh=mesh)
    checksum = sum(float((p.to_local() if hasattr(p, "to_local") else p).sum())
                   for p in model.parameters())
    out = {"peak": _status("VmHWM") - base, "held": model_bytes(model), "checksum": checksum}
    torch.save(out, os.path.join(out_dir, f"peak{world}_{rank}.pt"))
    if mesh is not None:
        leave_process_group(rank, out_dir)


def _tiny_llama():
    from transformers import LlamaConfig
    return LlamaConfig(**{k: v for k, v in TINY.items() if k != "model_type"}, vocab_size=80)


TINY_LLAMA = _tiny_llama()


def test_a_tp2_shard_build_peaks_well_under_the_whole_model_build(tmp_path):
    torch.set_num_threads(1)
    folder = str(tmp_path / "big")
    _save(folder, BIG, None)
    whole = sum(os.path.getsize(os.path.join(folder, f)) for f in os.listdir(folder)
                if f.endswith(".safetensors"))
    peaks = {}
    for world in (1, 2):
        mp.spawn(_peak_rank, args=(world, free_port(), folder, str(tmp_path)), nprocs=world,
                 join=True)
        peaks[world] = [torch.load(tmp_path / f"peak{world}_{r}.pt") for r in range(world)]
    one = peaks[1][0]
    assert one["held"] >= 0.95 * whole  # the unsharded build holds the whole model
    for rank in peaks[2]:
        assert rank["held"] <= 0.55 * whole  # half of every sharded tensor, norms whole
        ratio = rank["peak"] / one["peak"]
        assert ratio < 0.75, (f"tp=2 build peak {rank['peak'] / MIB:.1f} MiB vs whole "
                              f"{one['peak'] / MIB:.1f} MiB ({ratio:.2f}x)")
