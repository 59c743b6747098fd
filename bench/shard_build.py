"""Build peak per rank of a tensor-parallel model from a safetensors directory (issue 30):
tp=1 (`from_pretrained`, whole) vs tp=N built whole and then sharded (the path before
`hybridflow/workers/parallel/shard_build.py`) vs tp=N built shard by shard (the path now, through
`hybridflow.workers.models.build_causal_lm(tp_mesh=...)`).

The directory is saved first: a Llama with SmolLM2-135M-Instruct's shapes (hidden 576,
9 heads, 3 KV heads, intermediate 1536, vocabulary 49152, tied embeddings; `--layers`
of its 30; random init, fp32, no download). Each variant runs in fresh processes
(`torch.multiprocessing.spawn`, gloo, one torch thread per rank). Per rank, with the
imports, the process group and the model code's first use done beforehand and VmHWM
reset to VmRSS (`/proc/self/clear_refs`):

- weights: the bytes of this rank's parameters and buffers (a tied weight once);
- build peak: what building added to the high-water mark (VmHWM minus the RSS before);
- after a forward: RSS added once one forward has run (every weight touched:
  `from_pretrained` leaves a checkpoint's weights memory-mapped until they are read,
  so its build peak alone undercounts the whole model it holds);
- seconds of the build, and the largest difference of the forward's log-probs from
  tp=1's (vocab-parallel at tp>1).

    python bench/shard_build.py       # 8 layers, tp 3 -> bench/results/shard_build.json
    python bench/shard_build.py --layers 2 --tp 2 --out shard_build.json
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.harness import free_port, machine, table, write_results

MIB = 2**20
VARIANTS = ("tp1 from_pretrained", "whole then shard", "shard by shard")


def _status(field: str) -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(field)


def _save(args, folder: str) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    config = LlamaConfig(hidden_size=args.hidden, intermediate_size=args.intermediate,
                         num_hidden_layers=args.layers, num_attention_heads=args.heads,
                         num_key_value_heads=args.kv_heads, vocab_size=args.vocab,
                         max_position_embeddings=2048, tie_word_embeddings=True,
                         rms_norm_eps=1e-5, rope_theta=100000.0)
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(folder)
    toy = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                       "graphs", "assets", "toy_base")
    for name in ("tokenizer.json", "tokenizer_config.json"):  # any tokenizer: ids are given
        shutil.copy(os.path.join(toy, name), folder)


def _build(variant: str, folder: str, ctx):
    import torch
    from transformers import AutoModelForCausalLM
    from hybridflow.workers import models
    from hybridflow.workers.parallel.tensor_parallel import parallelize
    from hybridflow.workers.config import ModelConfig
    from hybridflow.workers.parallel.shard_build import _meta_model
    from hybridflow.workers.tokenizer import load_tokenizer
    cfg, tokenizer = ModelConfig(path=folder, device="cpu"), load_tokenizer(folder)
    mesh = models.role_tp_mesh(ctx)
    config = models._hf_config(cfg, tokenizer, folder)
    _meta_model(AutoModelForCausalLM, config, torch.float32)  # the model code's imports
    with open("/proc/self/clear_refs", "w") as fh:
        fh.write("5")  # VmHWM := VmRSS
    base, start = _status("VmRSS"), time.perf_counter()
    if variant == "whole then shard":
        model = models._build_whole(AutoModelForCausalLM, config, torch.float32, 0, folder,
                                    (), ())
        parallelize(model, mesh)
    else:
        model = models.build_causal_lm(cfg, tokenizer, "cpu", 0, tp_mesh=mesh)
    return model, base, time.perf_counter() - start


def _rank(rank: int, world: int, port: int, variant: str, folder: str, args, out: str):
    import warnings
    warnings.filterwarnings("ignore")
    import torch
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    from transformers.utils import logging as hf_logging
    hf_logging.set_verbosity_error()
    from hybridflow.core.context import WorkerContext
    from hybridflow.workers.models import model_bytes
    from hybridflow.workers.parallel.vocab_parallel import token_logprobs
    ctx = WorkerContext(rank=rank, world_size=world, local_rank=rank, device="cpu", tp=world)
    model, base, build_s = _build(variant, folder, ctx)
    record = {"rank": rank, "weights": model_bytes(model), "build_s": build_s,
              "peak_added": _status("VmHWM") - base, "rss_added": _status("VmRSS") - base}
    ids = torch.randint(0, args.vocab, (2, 32), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        logits = model(input_ids=ids).logits
        record["logp"] = token_logprobs(logits[:, :-1], ids[:, 1:]).tolist()
    record["rss_after_forward"] = _status("VmRSS") - base
    with open(os.path.join(out, f"rank{rank}.json"), "w") as fh:
        json.dump(record, fh)
    if world > 1:
        torch.distributed.barrier()


def _run(variant: str, world: int, folder: str, args) -> list[dict]:
    import torch.multiprocessing as mp
    with tempfile.TemporaryDirectory() as out:
        mp.spawn(_rank, args=(world, free_port(), variant, folder, args, out), nprocs=world,
                 join=True)
        records = []
        for r in range(world):
            with open(os.path.join(out, f"rank{r}.json")) as fh:
                records.append(json.load(fh))
        return records


def _summary(runs: list[list[dict]], reference: list[float]) -> dict:
    import torch
    ranks = [r for run in runs for r in run]
    ref = torch.tensor(reference)
    return {"weights_bytes_per_rank": max(r["weights"] for r in ranks),
            "build_peak_added_bytes_per_rank": max(r["peak_added"] for r in ranks),
            "build_peak_added_bytes_by_rank": [r["peak_added"] for r in ranks],
            "rss_after_forward_bytes_per_rank": max(r["rss_after_forward"] for r in ranks),
            "build_s": max(r["build_s"] for r in ranks),
            "max_logprob_diff_vs_tp1": max(float((torch.tensor(r["logp"]) - ref).abs().max())
                                           for r in ranks)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=576)
    parser.add_argument("--intermediate", type=int, default=1536)
    parser.add_argument("--layers", type=int, default=8, help="of SmolLM2-135M's 30")
    parser.add_argument("--heads", type=int, default=9)
    parser.add_argument("--kv-heads", type=int, default=3)
    parser.add_argument("--vocab", type=int, default=49152)
    parser.add_argument("--tp", type=int, default=3)
    parser.add_argument("--reps", type=int, default=1)
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS,
                        help="which to run (the first is tp=1's, the log-probs' reference)")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    if args.variants[0] != VARIANTS[0]:
        parser.error(f"--variants must start with {VARIANTS[0]!r} (the reference)")
    for what, n in (("--heads", args.heads), ("--kv-heads", args.kv_heads)):
        if n % args.tp:
            parser.error(f"{what} {n} is not divisible by --tp {args.tp}")
    info = machine()
    with tempfile.TemporaryDirectory() as folder:
        _save(args, folder)
        size = sum(os.path.getsize(os.path.join(folder, f)) for f in os.listdir(folder)
                   if f.endswith(".safetensors"))
        runs: dict[str, list] = {v: [] for v in args.variants}
        for _ in range(args.reps):
            for variant in args.variants:
                runs[variant].append(_run(variant, 1 if variant == VARIANTS[0] else args.tp,
                                          folder, args))
    reference = runs[VARIANTS[0]][0][0]["logp"]
    summary = {v: _summary(runs[v], reference) for v in args.variants}
    print(f"checkpoint {size / MIB:.0f} MiB: {args.layers} layers of SmolLM2-135M's shapes, "
          f"fp32, tied; tp {args.tp}; {args.reps} run(s); {info['cores']} cores, load "
          f"{info['load_avg_1m_at_start']}")
    rows = [[v, s["weights_bytes_per_rank"] / MIB, s["build_peak_added_bytes_per_rank"] / MIB,
             s["rss_after_forward_bytes_per_rank"] / MIB, s["build_s"],
             s["max_logprob_diff_vs_tp1"]] for v, s in summary.items()]
    print(table(["variant", "weights MiB/rank", "build peak added MiB/rank",
                 "RSS added after a forward MiB/rank", "build s", "max |dlogp| vs tp1"], rows))
    path = write_results("shard_build", {
        "machine": info, "config": vars(args), "checkpoint_bytes": size,
        "summary": summary, "runs": {v: [[{k: x for k, x in r.items() if k != "logp"}
                                          for r in run] for run in rs]
                                     for v, rs in runs.items()}}, args.out)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
