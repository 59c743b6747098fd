"""`bench/parallel.py --workers`: tp=1 vs tp=N through the project's workers (issue 30).

Each rank of a variant (`torch.multiprocessing.spawn`, gloo, one torch thread per rank,
`WorkerContext(tp=N)`: what `placement.parallel.actor.tp=N` gives a worker) builds an
`ActorWorker` on SmolLM2-135M-Instruct (`--model`, HYBRIDFLOW_SMOLLM2_DIR, or the
`hybridflow model smollm2` cache; without one, a Llama of its shapes from a config,
random init) and runs, in order, with a barrier between them:

- `rollout.generate`: `actor.generate` (the hf engine generating on the actor's own,
  tp-sharded module: the colocated rollout, in lockstep over the tp group);
- `actor.logprob` of those responses;
- `actor.update` (random advantages, one mini-batch, AdamW; the first update, so
  AdamW's moments are allocated inside it);
- the weight sync of a rollout on its own pool: the sender is `export_policy` (what
  `actor.export_weights` runs: every rank gathers each bucket, a collective at tp>1,
  rank 0 puts it) into `bench/weight_sync.FolderStore` (a folder standing in for Ray's
  object store, so only what each rank holds is counted), the receiver is
  `load_export` (what `rollout.load_weights` runs) into a tp=1 hf engine on rank 0
  after the sender is done (the same receiver at every tp).

Per phase and rank: seconds, the RSS high-water mark (VmHWM, reset through
/proc/self/clear_refs right before the phase) and its rise over the RSS at the start
of the phase. A checkpoint's weights are mapped lazily (safetensors): "build" reads
them all once and the receiver's model is written once before the sync, so no later
phase counts their first touch as its own memory. State kept: none (each rank writes
its JSON record into the run folder).
"""
from __future__ import annotations

import json
import os
import time

MIB = 2**20
PHASES = ("rollout.generate", "actor.logprob", "actor.update", "sync.send", "sync.receive")
SMOLLM2_CACHE = os.path.expanduser("~/.cache/hybridflow/smollm2-135m")
PROMPTS = ["What is 7 plus 5?", "Sam had 8 cards and gave away 3. How many are left?",
           "Name a colour.", "Count from one to five."]


def default_model() -> str | None:
    """The real SmolLM2 directory, if there is one here (None: build from its shapes)."""
    for path in (os.environ.get("HYBRIDFLOW_SMOLLM2_DIR"), SMOLLM2_CACHE):
        if path and os.path.isfile(os.path.join(path, "config.json")):
            return path
    return None


def worker_cfg(args) -> dict:
    """The actor's config: the real model's directory, or SmolLM2's shapes."""
    if args.model:
        model = {"path": args.model, "tokenizer": "auto", "hf_config": {}}
    else:
        model = {"hf_config": {
            "model_type": getattr(args, "model_type", "llama"), "hidden_size": args.hidden,
            "num_hidden_layers": args.layers,
            "intermediate_size": args.intermediate, "num_attention_heads": args.heads,
            "num_key_value_heads": args.kv_heads, "vocab_size": args.vocab,
            "tie_word_embeddings": True, "max_position_embeddings": 2048,
            "rope_theta": 100000.0}}
    rows = len(PROMPTS) * getattr(args, "prompt_copies", 1) * args.n
    model.update(device=getattr(args, "device", "cpu"), dtype=getattr(args, "dtype", "float32"))
    return {"model": model,
            "actor": {"lr": 1e-6, "strategy": "fsdp2", "ppo_epochs": 1,
                      "mini_batch_size": rows, "micro_batch_size": rows},
            "rollout": {"max_new_tokens": args.new_tokens, "n": args.n,
                        "log_prob_micro_batch_size": rows,
                        "weight_bucket_mb": args.bucket_mb},
            "critic": {}, "ref": {}, "reward": {}}


def _status(field: str) -> int:
    with open("/proc/self/status") as fh:
        return next(int(line.split()[1]) * 1024 for line in fh if line.startswith(field + ":"))


class RssMeter:
    """A phase's peak as the process's RSS high-water mark (VmHWM, reset through
    /proc/self/clear_refs at the start of the phase)."""

    def start(self) -> None:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")  # VmHWM := VmRSS now
        self.before = _status("VmRSS")

    def sync(self) -> None:
        pass

    def stop(self) -> tuple[int, int]:
        peak = _status("VmHWM")
        return peak, peak - self.before


class CudaMeter(RssMeter):
    """A phase's peak as the device's `max_memory_allocated` (bench/gpu.py --tp)."""

    def __init__(self, device):
        self.device = device

    def start(self) -> None:
        import torch
        torch.cuda.synchronize(self.device)
        torch.cuda.reset_peak_memory_stats(self.device)
        self.before = torch.cuda.memory_allocated(self.device)

    def sync(self) -> None:
        import torch
        torch.cuda.synchronize(self.device)

    def stop(self) -> tuple[int, int]:
        import torch
        peak = torch.cuda.max_memory_allocated(self.device)
        return peak, peak - self.before


def _measured(record: dict, name: str, work, barrier, meter):
    """Run `work()` as phase `name` of this rank: seconds, the peak and its rise."""
    barrier()
    meter.start()
    start = time.perf_counter()
    out = work()
    meter.sync()
    seconds = time.perf_counter() - start
    peak, rise = meter.stop()
    record[name] = {"seconds": seconds, "peak_rss_bytes": peak, "rise_bytes": rise}
    return out


def _prompts(tokenizer, copies: int = 1):
    """The prompts (`copies` times over), left-padded as the data loader makes them."""
    import torch

    from hybridflow.core.batch import Batch
    texts = PROMPTS * copies
    ids = [tokenizer(text)["input_ids"] for text in texts]
    width = max(len(row) for row in ids)
    input_ids = torch.full((len(ids), width), tokenizer.pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(ids), width), dtype=torch.long)
    for i, row in enumerate(ids):
        input_ids[i, width - len(row):] = torch.tensor(row)
        mask[i, width - len(row):] = 1
    return Batch({"input_ids": input_ids, "attention_mask": mask},
                 {"uid": [f"u{i}" for i in range(len(texts))]})


def _receiver(actor):
    """A rollout's hf engine on a model of the actor's config (other weights, tp=1)."""
    from hybridflow.workers.models import build_causal_lm
    from hybridflow.workers.rollout.hf import HFEngine
    import torch
    model = build_causal_lm(actor.model_cfg, actor.tokenizer, actor.device, seed=1)
    with torch.no_grad():  # weights loaded from safetensors are mapped lazily: written
        for p in model.parameters():  # here, the sync's peak is its buffers, not them
            p.add_(0)
    return HFEngine(model, actor.tokenizer, actor.device, shares_module=False, version=0)


def _resident(actor):
    """`actor` with every local weight read once: a checkpoint's weights are mapped
    lazily, so the first phase to read them would otherwise count them as its own."""
    for p in actor.module.parameters():
        float((p.to_local() if hasattr(p, "to_local") else p).sum())
    return actor


def rank_main(rank: int, world: int, port: int, args, out_dir: str) -> None:
    """One gloo rank of `bench/parallel.py --workers` (torch.multiprocessing.spawn)."""
    import torch
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    from hybridflow.workers import WorkerContext
    ctx = WorkerContext(rank=rank, world_size=world, local_rank=rank, device="cpu", tp=world)
    record = run_phases(ctx, args, out_dir, RssMeter())
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as fh:
        json.dump(record, fh)
    import torch.distributed as dist
    if dist.is_initialized():
        from bench.harness import leave_group
        leave_group(rank, world, out_dir)


def run_phases(ctx, args, out_dir: str, meter) -> dict:
    """This rank's record of every phase (see the module docstring)."""
    import warnings
    warnings.filterwarnings("ignore")
    import torch
    import torch.distributed as dist

    from bench.harness import quiet_logs
    from bench.weight_sync import FolderStore
    from hybridflow.core.batch import Batch
    from hybridflow.workers import ActorWorker
    from hybridflow.workers.rollout.weights import export_policy, load_export

    quiet_logs()
    rank, world = ctx.rank, ctx.world_size
    record: dict = {"rank": rank, "tp": ctx.tp}

    def barrier():
        if dist.is_initialized():
            dist.barrier()

    def measured(name, work, sync=barrier):
        return _measured(record, name, work, sync, meter)

    actor = measured("build", lambda: _resident(ActorWorker(worker_cfg(args), ctx)),
                     lambda: None)
    record["weight_bytes"] = sum((p.to_local() if hasattr(p, "to_local") else p).nbytes
                                 for p in actor.module.parameters())
    prompts = _prompts(actor.tokenizer, getattr(args, "prompt_copies", 1))
    torch.manual_seed(0)  # every rank of the group samples the same tokens
    rollout = measured("rollout.generate", lambda: actor.generate(prompts))
    old = measured("actor.logprob", lambda: actor.logprob(rollout))
    mask = rollout["response_mask"].float()
    gen = torch.Generator().manual_seed(1)
    batch = rollout.union(old).update(Batch({
        "advantages": torch.randn(mask.shape, generator=gen) * mask}))
    metrics = measured("actor.update", lambda: actor.update(batch))
    record["update_metrics"] = {k: float(v) for k, v in metrics.meta["metrics"].items()
                                if isinstance(v, (int, float))}
    record["response_tokens"] = int(mask.sum())
    folder = os.path.join(out_dir, "store")
    os.makedirs(folder, exist_ok=True)
    bucket = max(1, int(args.bucket_mb * MIB))
    export = measured("sync.send", lambda: export_policy(
        actor.module, actor.policy_version, bucket, rank=rank, world_size=world,
        store=FolderStore(folder)))
    barrier()
    engine = _receiver(actor) if rank == 0 else None
    if engine is not None:
        measured("sync.receive", lambda: load_export(engine, export), lambda: None)
    barrier()
    equal = _same_weights(actor.module, engine.module if engine is not None else None)
    if rank == 0:
        record["received_equal"] = equal
    return record


def _same_weights(trained, received) -> bool:
    """Whether the receiver holds the trained weights. Every rank calls it: each
    tensor is gathered whole from its shards (a collective at tp>1); the receiver's
    rank compares."""
    from hybridflow.workers.parallel.gather import full_tensor, plain_weight_name
    state = received.state_dict() if received is not None else {}
    equal = True
    for key, value in trained.state_dict().items():
        whole = full_tensor(value)
        name = plain_weight_name(key)
        if received is not None and name in state:
            equal = equal and bool(whole.equal(state[name]))
    return equal


def summarize(runs: dict[int, list[list[dict]]]) -> tuple[dict, list]:
    """Per tp and phase: the slowest rank's seconds (median over runs), the highest
    per-rank VmHWM and rise; rows for the table."""
    from bench.harness import median
    summary, rows = {}, []
    for tp, variant in runs.items():
        ranks = [r for run in variant for r in run]
        summary[tp] = {"weight_bytes_per_rank": max(r["weight_bytes"] for r in ranks),
                       "received_equal": all(r.get("received_equal", True) for r in ranks)}
        for phase in ("build", *PHASES):
            got = [r for r in ranks if phase in r]
            secs = median([max(r[phase]["seconds"] for r in run if phase in r)
                           for run in variant])
            peak = max(r[phase]["peak_rss_bytes"] for r in got)
            rise = max(r[phase]["rise_bytes"] for r in got)
            summary[tp][phase] = {"seconds": secs, "peak_rss_bytes": peak, "rise_bytes": rise}
            rows.append([tp, phase, secs, peak / MIB, rise / MIB])
    return summary, rows
