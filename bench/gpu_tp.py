"""`bench/gpu.py --tp N`: tp=1 vs tp=N through the project's workers on GPUs, each
variant one `torchrun --standalone --nproc-per-node` (NCCL on CUDA, gloo with
`--device cpu`), the variants alternated over `--reps`; the phases are
`bench/parallel_workers.run_phases` (rollout.generate, actor.logprob, actor.update, the
weight sync's send and receive), the peaks `torch.cuda.max_memory_allocated` per rank
(RSS on the CPU).

UNRUN on a GPU: written on a CPU-only machine; its `--device cpu` path runs in
tests/bench/test_gpu_tp_bench.py. State kept: none (each rank writes its record into the
variant's temporary folder; the driver reads them back).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

MIB = 2**20
FORWARDED = ("device", "n", "model", "new_tokens", "prompt_copies", "bucket_mb", "shapes")


def _model_args(args) -> None:
    """The shape fields `parallel_workers.worker_cfg` reads: `--shapes` (JSON, tests) or
    Qwen2.5-0.5B's (bench/workload.py's QWEN2_05B); a `--model` directory's own heads."""
    from bench.workload import QWEN2_05B
    shapes = json.loads(args.shapes) if args.shapes else QWEN2_05B
    args.model_type = shapes.get("model_type", "llama")
    args.hidden, args.layers = shapes["hidden_size"], shapes["num_hidden_layers"]
    args.intermediate, args.vocab = shapes["intermediate_size"], shapes["vocab_size"]
    args.heads, args.kv_heads = shapes["num_attention_heads"], shapes["num_key_value_heads"]
    if args.model:
        with open(os.path.join(args.model, "config.json")) as fh:
            config = json.load(fh)
        args.heads, args.kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    args.dtype = "bfloat16" if args.device.startswith("cuda") else "float32"


def child(args) -> int:
    """One torchrun rank: its record of every phase, into the folder `--tp-child`."""
    import torch
    import torch.distributed as dist

    from bench.parallel_workers import CudaMeter, RssMeter, run_phases
    from hybridflow.workers import WorkerContext
    torch.set_num_threads(1)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_RANK", rank))
    with open(os.path.join(args.tp_child, "args.json")) as fh:
        vars(args).update(json.load(fh))
    _model_args(args)
    cuda = args.device.startswith("cuda")
    ctx = WorkerContext(rank=rank, world_size=world, local_rank=local,
                        device="cuda" if cuda else "cpu", tp=world)
    meter = CudaMeter(torch.device("cuda", local)) if cuda else RssMeter()
    record = run_phases(ctx, args, args.tp_child, meter)
    with open(os.path.join(args.tp_child, f"rank{rank}.json"), "w") as fh:
        json.dump(record, fh)
    if dist.is_initialized():  # torchrun's agent hosts the store: any order may leave
        dist.barrier()
        dist.destroy_process_group()
    return 0


def _variant(args, script: str, tp: int) -> list[dict]:
    with tempfile.TemporaryDirectory() as folder:
        # the ranks' options go in a file: torchrun would take `--n` for its own options
        with open(os.path.join(folder, "args.json"), "w") as fh:
            json.dump({name: getattr(args, name) for name in FORWARDED}, fh)
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               f"--nproc-per-node={tp}", script, "--tp-child", folder]
        subprocess.run(cmd, check=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
        ranks = []
        for rank in range(tp):
            with open(os.path.join(folder, f"rank{rank}.json")) as fh:
                ranks.append(json.load(fh))
    return ranks


def compare(args, script: str) -> int:
    """tp=1 vs tp=`args.tp`, alternated; prints the table and writes the JSON."""
    from bench.harness import machine, table, write_results
    from bench.parallel_workers import PHASES, summarize
    _model_args(args)
    for what, n in (("heads", args.heads), ("KV heads", args.kv_heads)):
        if n % args.tp:
            print(f"bench/gpu.py --tp {args.tp}: the model's {n} {what} are not divisible by "
                  f"it; pick a tp that divides both (or another --model)", file=sys.stderr)
            return 2
    info, variants = machine(), (1, args.tp)
    runs: dict[int, list[list[dict]]] = {tp: [] for tp in variants}
    for rep in range(args.reps):  # alternated: who goes first rotates
        for tp in variants[rep % 2:] + variants[:rep % 2]:
            runs[tp].append(_variant(args, script, tp))
    summary, rows = summarize(runs)
    for row in rows:  # the per-rank peak against tp=1's
        row.append(summary[row[0]][row[1]]["peak_rss_bytes"]
                   / summary[1][row[1]]["peak_rss_bytes"])
    where = "max_memory_allocated" if args.device.startswith("cuda") else "RSS"
    shapes = f"shapes {args.shapes}" if args.shapes else "Qwen2.5-0.5B's shapes"
    print(f"{args.model or shapes + ', random weights'}; {args.dtype}; {args.device}; "
          f"{args.reps} alternated runs")
    print(table(["tp", "phase", "seconds (slowest rank, median)", f"peak {where} MiB/rank",
                 "rise MiB/rank", "peak x tp1"], rows))
    path = write_results("gpu_tp", {
        "machine": info, "config": vars(args), "phases": list(PHASES),
        "summary": {str(k): v for k, v in summary.items()},
        "runs": {str(k): v for k, v in runs.items()}}, args.out)
    print(f"wrote {path}")
    return 0
