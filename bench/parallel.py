"""Tensor parallelism at tp=1 vs tp=N (issue 30) on a model with SmolLM2-135M-Instruct's
shapes: per-rank resident weights, per-rank RSS, and seconds of one log-prob forward and
one training step.

The model is built from a transformers LlamaConfig (hidden 576, 30 layers, 9 heads, 3 KV
heads, intermediate 1536, vocabulary 49152, tied embeddings; random init, no download)
and sharded by the project's own code: `WorkerContext.device_mesh()["tp"]` and
`hybridflow.workers.parallel.tensor_parallel.parallelize` (the decoder layers by the
model's plan, the embedding and the tied head by vocabulary rows, one shared shard).
Each variant runs in fresh processes (`torch.multiprocessing.spawn`, gloo, one torch
thread per rank); the variants are alternated over `--reps` repetitions (who goes first
rotates). Per rank:

- weight bytes: the sum of each parameter's local shard bytes (a tied weight once);
- RSS after building and sharding (VmRSS), what building and sharding added to it (the
  RSS before, after the imports, subtracted), and the high-water mark (VmHWM) then:
  every rank builds the whole model before sharding it; and RSS after the step (AdamW's
  moments and the gradients added);
- seconds of one log-prob forward: the model's forward, its head's logits left sharded
  on the vocabulary, and `hybridflow.workers.parallel.vocab_parallel.token_logprobs` (all-reduces
  over the tp group, never whole-vocabulary logits);
- seconds of one training step: that forward, a token-mean loss, backward, the
  project's `clip_grad_norm` over DTensor and plain gradients, and an AdamW step.

Seconds are the slowest rank's. On a machine with fewer cores than ranks (SmolLM2's 9
heads and 3 KV heads make its tp 3: three ranks on two cores here) the seconds of tp>1
are not comparable with tp=1; memory is.

    python bench/parallel.py                    # -> bench/results/parallel.json
    python bench/parallel.py --layers 8 --reps 2
    python bench/parallel.py --hidden 64 --intermediate 128 --heads 4 --kv-heads 2 \\
        --layers 2 --vocab 512 --tp 2 --reps 1 --out parallel.json
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.harness import (free_port, leave_group, machine, median, peak_rss_bytes,
                           rss_bytes, table, write_results)

MIB = 2**20
TARGET = 0.4  # issue 30: per-rank resident weights at tp=3 <= 0.4x tp=1's


def _config(args):
    from transformers import LlamaConfig
    return LlamaConfig(hidden_size=args.hidden, intermediate_size=args.intermediate,
                       num_hidden_layers=args.layers, num_attention_heads=args.heads,
                       num_key_value_heads=args.kv_heads, vocab_size=args.vocab,
                       max_position_embeddings=max(2048, args.seq), tie_word_embeddings=True,
                       rms_norm_eps=1e-5, rope_theta=100000.0)


def _local(t):
    return t.to_local() if hasattr(t, "to_local") else t


def _weight_bytes(model) -> int:
    """Bytes of this rank's shards; `parameters()` yields a tied weight once."""
    return sum(_local(p).numel() * _local(p).element_size() for p in model.parameters())


def _logprobs(model, ids):
    from hybridflow.workers.parallel.vocab_parallel import token_logprobs
    logits = model(input_ids=ids).logits  # sharded on the vocabulary at tp>1
    return token_logprobs(logits[:, :-1], ids[:, 1:])


def _rank(rank: int, world: int, port: int, args, out_dir: str) -> None:
    import warnings
    warnings.filterwarnings("ignore")
    import torch
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    from transformers import LlamaForCausalLM
    from transformers.utils import logging as hf_logging
    hf_logging.set_verbosity_error()
    from hybridflow.core.context import WorkerContext
    from hybridflow.workers.parallel.tensor_parallel import clip_grad_norm, parallelize
    base_rss = rss_bytes()
    ctx = WorkerContext(rank=rank, world_size=world, local_rank=rank, device="cpu", tp=world)
    mesh = ctx.device_mesh()  # None at tp=1; creates the gloo group otherwise
    torch.manual_seed(0)
    start = time.perf_counter()
    model = LlamaForCausalLM(_config(args))
    model.train()
    if mesh is not None:
        parallelize(model, mesh["tp"])
    build_s = time.perf_counter() - start
    out = {"rank": rank, "tp": world, "weight_bytes": _weight_bytes(model),
           "rss_before_bytes": base_rss, "rss_bytes": rss_bytes(),
           "peak_rss_bytes": peak_rss_bytes(), "build_s": build_s,
           "tied": model.get_output_embeddings().weight is model.get_input_embeddings().weight}
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(0, args.vocab, (args.batch, args.seq), generator=gen)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5)

    def barrier():
        if mesh is not None:
            torch.distributed.barrier()

    with torch.no_grad():
        _logprobs(model, ids)  # warm-up
    barrier()
    start = time.perf_counter()
    with torch.no_grad():
        logp = _logprobs(model, ids)
    out["logprob_s"] = time.perf_counter() - start
    out["logprob_mean"] = float(logp.mean())
    barrier()
    start = time.perf_counter()
    opt.zero_grad(set_to_none=True)
    loss = -_logprobs(model, ids).mean()
    loss.backward()
    out["grad_norm"] = clip_grad_norm(list(model.parameters()), 1.0)
    opt.step()
    out["train_step_s"] = time.perf_counter() - start
    out["loss"] = float(loss)
    out["rss_after_step_bytes"] = rss_bytes()
    barrier()
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as fh:
        json.dump(out, fh)
    if mesh is not None:
        leave_group(rank, world, out_dir)


def _run(args, tp: int, target=_rank) -> list[dict]:
    import torch.multiprocessing as mp
    with tempfile.TemporaryDirectory() as out_dir:
        mp.spawn(target, args=(tp, free_port(), args, out_dir), nprocs=tp, join=True)
        ranks = []
        for r in range(tp):
            with open(os.path.join(out_dir, f"rank{r}.json")) as fh:
                ranks.append(json.load(fh))
    return ranks


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=576)
    parser.add_argument("--intermediate", type=int, default=1536)
    parser.add_argument("--layers", type=int, default=30,
                        help="decoder layers (SmolLM2-135M: 30; fewer to save time)")
    parser.add_argument("--heads", type=int, default=9)
    parser.add_argument("--kv-heads", type=int, default=3)
    parser.add_argument("--vocab", type=int, default=49152)
    parser.add_argument("--tp", type=int, default=3, help="the sharded variant's tp size")
    parser.add_argument("--batch", type=int, default=4, help="rows per call")
    parser.add_argument("--seq", type=int, default=64, help="tokens per row")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--out", default=None)
    parser.add_argument("--workers", action="store_true",
                        help="through the project's workers: rollout.generate, actor.logprob, "
                             "actor.update and the weight sync (bench/parallel_workers.py)")
    parser.add_argument("--model", default=None, help="--workers: SmolLM2's directory "
                        "(default: HYBRIDFLOW_SMOLLM2_DIR or hybridflow model smollm2's cache)")
    parser.add_argument("--random-init", action="store_true",
                        help="--workers: build from the shape flags even where the model exists")
    parser.add_argument("--n", type=int, default=2, help="--workers: samples per prompt")
    parser.add_argument("--new-tokens", type=int, default=16,
                        help="--workers: rollout.max_new_tokens")
    parser.add_argument("--bucket-mb", type=float, default=256.0,
                        help="--workers: rollout.weight_bucket_mb")
    args = parser.parse_args()
    if args.workers:
        return _workers_main(parser, args)
    for what, n in (("--heads", args.heads), ("--kv-heads", args.kv_heads)):
        if n % args.tp:
            parser.error(f"{what} {n} is not divisible by --tp {args.tp}")
    variants = (1, args.tp)
    runs: dict[int, list[list[dict]]] = {tp: [] for tp in variants}
    info = machine()
    for rep in range(args.reps):  # alternated: who goes first rotates
        for tp in variants[rep % 2:] + variants[:rep % 2]:
            runs[tp].append(_run(args, tp))
    summary, rows = {}, []
    for tp in variants:
        ranks = [r for run in runs[tp] for r in run]
        summary[tp] = {
            "weight_bytes_per_rank": max(r["weight_bytes"] for r in ranks),
            "rss_bytes_per_rank": median([r["rss_bytes"] for r in ranks]),
            # what building and sharding added to the process (imports excluded)
            "rss_added_bytes_per_rank": median([r["rss_bytes"] - r["rss_before_bytes"]
                                                for r in ranks]),
            "peak_rss_build_bytes_per_rank": max(r["peak_rss_bytes"] for r in ranks),
            "rss_after_step_bytes_per_rank": median([r["rss_after_step_bytes"] for r in ranks]),
            # the slowest rank of each run, the median over runs
            "logprob_s": median([max(r["logprob_s"] for r in run) for run in runs[tp]]),
            "train_step_s": median([max(r["train_step_s"] for r in run) for run in runs[tp]]),
            "build_s": median([max(r["build_s"] for r in run) for run in runs[tp]]),
            "loss": runs[tp][0][0]["loss"], "tied": all(r["tied"] for r in ranks)}
    one, many = summary[1], summary[args.tp]
    ratio = many["weight_bytes_per_rank"] / one["weight_bytes_per_rank"]
    rss_ratio = many["rss_bytes_per_rank"] / one["rss_bytes_per_rank"]
    for tp in variants:
        s = summary[tp]
        rows.append([tp, s["weight_bytes_per_rank"] / MIB,
                     s["weight_bytes_per_rank"] / one["weight_bytes_per_rank"],
                     s["rss_bytes_per_rank"] / MIB, s["rss_added_bytes_per_rank"] / MIB,
                     s["peak_rss_build_bytes_per_rank"] / MIB,
                     s["rss_after_step_bytes_per_rank"] / MIB, s["logprob_s"],
                     s["train_step_s"]])
    cores = info["cores"] or 0
    oversubscribed = args.tp > cores
    print(f"Llama from a config: hidden {args.hidden}, {args.layers} layers, {args.heads} heads, "
          f"{args.kv_heads} KV heads, intermediate {args.intermediate}, vocab {args.vocab}, "
          f"tied; batch {args.batch} x {args.seq} tokens, fp32, gloo, 1 torch thread per "
          f"rank, {args.reps} alternated runs; {cores} cores, load "
          f"{info['load_avg_1m_at_start']}")
    if oversubscribed:
        print(f"NOTE: {args.tp} ranks on {cores} cores: memory is meaningful, the seconds "
              f"of tp={args.tp} are not comparable with tp=1")
    print(table(["tp", "weights MiB/rank", "x tp1", "RSS MiB/rank", "of it added MiB/rank",
                 "build peak MiB/rank",
                 "RSS after step MiB/rank", "logprob s", "train step s"], rows))
    print(f"resident weights tp{args.tp}/tp1 = {ratio:.3f} (target <= {TARGET}: "
          f"{'met' if ratio <= TARGET else 'MISSED'}); RSS tp{args.tp}/tp1 = {rss_ratio:.3f}")
    full = args.layers == 30 and args.hidden == 576 and args.vocab == 49152
    path = write_results("parallel", {
        "machine": info, "config": vars(args), "smollm2_shapes": full,
        "layers_note": None if full or args.layers == 30 else
        f"{args.layers} of SmolLM2-135M's 30 layers", "oversubscribed": oversubscribed,
        "summary": {str(k): v for k, v in summary.items()},
        "weight_ratio": ratio, "rss_ratio": rss_ratio, "target_weight_ratio": TARGET,
        "target_met": ratio <= TARGET, "runs": {str(k): v for k, v in runs.items()}},
        args.out)
    print(f"wrote {path}")


def _workers_main(parser, args) -> None:
    """tp=1 vs tp=N through the workers (bench/parallel_workers.py), alternated."""
    from bench.parallel_workers import PHASES, default_model, rank_main, summarize
    args.model = None if args.random_init else args.model or default_model()
    if args.model:
        with open(os.path.join(args.model, "config.json")) as fh:
            config = json.load(fh)
        args.heads, args.kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    for what, n in (("heads", args.heads), ("KV heads", args.kv_heads)):
        if n % args.tp:
            parser.error(f"the model's {n} {what} are not divisible by --tp {args.tp}")
    info, variants = machine(), (1, args.tp)
    runs: dict[int, list[list[dict]]] = {tp: [] for tp in variants}
    for rep in range(args.reps):  # alternated: who goes first rotates
        for tp in variants[rep % 2:] + variants[:rep % 2]:
            runs[tp].append(_run(args, tp, rank_main))
    summary, rows = summarize(runs)
    one = summary[1]
    for row in rows:  # the per-rank peak against tp=1's
        row.append(summary[row[0]][row[1]]["peak_rss_bytes"] / one[row[1]]["peak_rss_bytes"])
    cores = info["cores"] or 0
    print(f"{'SmolLM2-135M-Instruct ' + args.model if args.model else 'SmolLM2 shapes, random'}"
          f"; {args.layers if not args.model else 'all'} layers, fp32, gloo, 1 torch thread "
          f"per rank, {args.reps} alternated runs; {cores} cores, load "
          f"{info['load_avg_1m_at_start']}")
    if args.tp > cores:
        print(f"NOTE: {args.tp} ranks on {cores} cores: memory is meaningful, the seconds "
              f"of tp={args.tp} are not comparable with tp=1")
    print(table(["tp", "phase", "seconds (slowest rank, median)", "peak RSS MiB/rank",
                 "rise MiB/rank", "peak x tp1"], rows))
    ratio = summary[args.tp]["weight_bytes_per_rank"] / one["weight_bytes_per_rank"]
    print(f"weights per rank tp{args.tp}/tp1 = {ratio:.3f}; the receiver holds the trained "
          f"weights: {all(s['received_equal'] for s in summary.values())}")
    path = write_results("parallel_workers", {
        "machine": info, "config": vars(args), "phases": list(PHASES),
        "oversubscribed": args.tp > cores, "weight_ratio": ratio,
        "summary": {str(k): v for k, v in summary.items()},
        "runs": {str(k): v for k, v in runs.items()}}, args.out)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
