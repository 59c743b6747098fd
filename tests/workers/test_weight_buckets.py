"""Weight sync bucket by bucket (hybridflow/workers/parallel/gather.py, rollout/weights.py): an
engine loaded from the buckets holds the policy's weights (plain names, a tied tensor
sent once, LoRA merged), buckets stay under their size, the per-bucket store path
round-trips, and a sync's transient memory per rank is about two buckets, not the
model: measured as the RSS high-water mark (VmHWM, reset through /proc/self/clear_refs)
on two FSDP2 ranks, colocated (gather -> engine) and split (gather -> store -> engine)."""
import os
import subprocess
import sys

import pytest
import torch
import torch.multiprocessing as mp
from transformers import AutoConfig, AutoModelForCausalLM

from bench.weight_sync import FolderStore  # a store that keeps no bucket in memory
from tests.support.workers import TINY
from tests.support.ports import free_port
from hybridflow.workers.parallel.gather import gathered_buckets, weight_plan
from hybridflow.workers.rollout.hf import HFEngine
from hybridflow.workers.rollout.weights import export_policy, load_export, refresh_engine

MB = 2**20
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _model(tied: bool = False, seed: int = 0, **config):
    torch.manual_seed(seed)
    cfg = {**TINY, "tie_word_embeddings": tied, "vocab_size": 40, **config}
    return AutoModelForCausalLM.from_config(AutoConfig.for_model(**cfg))


def _engine(model) -> HFEngine:
    return HFEngine(model, None, torch.device("cpu"), shares_module=False, version=0)


def _assert_same(source, target):
    for key, value in source.state_dict().items():
        assert torch.equal(target.state_dict()[key], value), key


@pytest.mark.parametrize("tied", [False, True])
def test_an_engine_loaded_bucket_by_bucket_holds_the_policy(tied):
    source, engine = _model(tied, seed=0), _engine(_model(tied, seed=1))
    plan = weight_plan(source, bucket_bytes=4096)
    names = [e.name for e in plan.entries]
    assert ("lm_head.weight" in names) is not tied  # a tied tensor is sent once
    assert len(plan.buckets) > 3
    for first, end in plan.buckets:  # under the size, or one tensor alone
        assert end - first == 1 or sum(e.nbytes for e in plan.entries[first:end]) <= 4096
    refresh_engine(engine, source, version=3, bucket_bytes=4096)
    assert engine.policy_version == 3
    _assert_same(source, engine.module)  # the receiver's model ties the head itself


def test_a_lora_policy_arrives_merged_per_layer():
    peft = pytest.importorskip("peft")
    from hybridflow.workers.lora import merged_state_dict
    torch.manual_seed(0)
    model = peft.get_peft_model(_model(), peft.LoraConfig(
        r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"))
    with torch.no_grad():  # B starts at zero: give the adapters something to merge
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_()
    expected = merged_state_dict(model)  # the whole-model merge, as a reference
    got = {n: t for bucket in gathered_buckets(model, weight_plan(model, 2048))
           for n, t in bucket}
    assert set(got) == set(expected) and not any("lora" in n for n in got)
    for name, value in expected.items():
        assert torch.allclose(got[name], value, atol=1e-6), name
    assert not torch.equal(got["model.layers.0.self_attn.q_proj.weight"],
                           model.state_dict()[
                               "base_model.model.model.layers.0.self_attn.q_proj.base_layer.weight"])


def test_gathering_a_plain_model_does_not_import_peft():
    """Only who makes LoRA layers imports peft: the sync of a plain model never pays
    that import (it was ~0.2 s of each process's first sync, bench/weight_sync.py --ray)."""
    code = ("import sys, torch\n"
            "from hybridflow.workers.parallel.gather import gathered_buckets, weight_plan\n"
            "m = torch.nn.Linear(4, 4)\n"
            "got = [n for b in gathered_buckets(m, weight_plan(m, 64)) for n, _ in b]\n"
            "assert got == ['weight', 'bias'], got\n"
            "print(sorted(k for k in sys.modules if k.split('.')[0] == 'peft'))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=REPO, env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_the_stored_path_round_trips_bucket_by_bucket(tmp_path):
    source, engine = _model(seed=0), _engine(_model(seed=1))
    store = FolderStore(str(tmp_path))
    export = export_policy(source, version=5, bucket_bytes=4096, store=store)
    index = export["weight_index"][0]
    assert store.count == len(index.buckets) > 3  # one put per bucket
    load_export(engine, export)
    assert engine.policy_version == 5
    _assert_same(source, engine.module)


# ------------------------------------------------------------ memory, 2 ranks
BIG = dict(hidden_size=512, intermediate_size=1024, num_hidden_layers=6,
           num_attention_heads=8, num_key_value_heads=8, vocab_size=2000)  # ~71 MB fp32
BUCKET = 4 * MB


def _rss_reset() -> int:
    with open("/proc/self/clear_refs", "w") as fh:
        fh.write("5")  # VmHWM := current RSS
    return _status("VmRSS")


def _status(field: str) -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(field)


def _rank_main(rank: int, port: int, out_dir: str):
    torch.set_num_threads(1)
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    mesh = init_device_mesh("cpu", (2,))
    reference = _model(seed=0, **BIG)
    model = _model(seed=0, **BIG)
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    colocated, split = _engine(_model(seed=1, **BIG)), _engine(_model(seed=2, **BIG))
    tiny = _model(seed=0)  # warm-up: the gather's one-time set-up (gloo, DTensor caches)
    fully_shard(tiny, mesh=mesh)
    refresh_engine(_engine(_model(seed=1)), tiny, version=1, bucket_bytes=BUCKET)
    peaks = {}
    base = _rss_reset()
    refresh_engine(colocated, model, version=1, bucket_bytes=BUCKET)
    peaks["colocated"] = _status("VmHWM") - base
    os.makedirs(os.path.join(out_dir, f"store{rank}"))
    base = _rss_reset()
    export = export_policy(model, 2, BUCKET, rank=rank, world_size=2,
                           store=FolderStore(os.path.join(out_dir, f"store{rank}")))
    peaks["sender"] = _status("VmHWM") - base
    if rank == 0:
        base = _rss_reset()
        load_export(split, export)
        peaks["receiver"] = _status("VmHWM") - base
        _assert_same(reference, split.module)
    _assert_same(reference, colocated.module)
    # any placement: a weight sharded on its columns, a bias replicated
    linear = torch.nn.Linear(8, 6)
    full = {k: v.detach().clone() for k, v in linear.state_dict().items()}
    linear.weight = torch.nn.Parameter(distribute_tensor(full["weight"], mesh, [Shard(1)]))
    linear.bias = torch.nn.Parameter(distribute_tensor(full["bias"], mesh, [Replicate()]))
    got = dict(b for bucket in gathered_buckets(linear, weight_plan(linear, 64)) for b in bucket)
    assert all(torch.equal(got[k], v) for k, v in full.items())
    model_bytes = sum(p.numel() * p.element_size() for p in reference.parameters())
    torch.save({"peaks": peaks, "model_bytes": model_bytes},
               os.path.join(out_dir, f"rank{rank}.pt"))
    dist.barrier()
    dist.destroy_process_group()


@pytest.mark.slow  # two gloo ranks, a 71 MB model four times each (~20 s)
@pytest.mark.skipif(not os.path.exists("/proc/self/clear_refs"), reason="needs Linux /proc")
def test_a_sync_holds_about_two_buckets_per_rank_not_the_model(tmp_path, monkeypatch):
    # the ranks' malloc hands every freed buffer over 64 KiB back to the OS, so the
    # high-water mark counts what the sync holds, not what glibc keeps cached
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "65536")
    mp.spawn(_rank_main, args=(free_port(), str(tmp_path)), nprocs=2, join=True)
    for rank in (0, 1):
        result = torch.load(tmp_path / f"rank{rank}.pt")
        model_bytes = result["model_bytes"]
        assert model_bytes > 15 * BUCKET  # the model dominates the bound below
        for where, peak in result["peaks"].items():
            # a bucket being filled, the tensor being gathered and the gather's
            # own buffers (all_gather output, padding): about two buckets, plus slack
            assert peak <= 2 * BUCKET + 4 * MB, (rank, where, peak / MB)
