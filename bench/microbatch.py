"""One update step with row micro-batches against a token budget and against packed
sequences, on the benchmark workload's long-tailed rollout (`bench/workload.py`).

Every mode runs the same mini-batch through `Trainer.train` with a token-mean
policy-gradient loss. Rows: `--rows` rows per micro-batch, every one padded to the
batch's width. Budget: `max_tokens = rows x width` (the same peak micro-batch size),
so the rows are grouped by length and each micro-batch trimmed to its longest row.
Packed: the same budget counted in real tokens, each micro-batch run as one row of
its real tokens (`model.use_remove_padding`: `hybridflow/workers/packing.py`, with
per-sequence sdpa attention, `varlen_attention.py`).
The modes alternate `--reps` times, torch on one thread; the first step of each is a
warm-up (AdamW allocates its moments) and is not counted.

    python bench/microbatch.py                    # 5m model, 8 prompts x 4, R=256
    python bench/microbatch.py --size 10m --prompts 16
    python bench/microbatch.py --prompts 2 --max-response 32 --reps 1   # a quick check
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from types import SimpleNamespace

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench import workload
from hybridflow.workers.config import ActorConfig
from hybridflow.workers.loss_inputs import PolicyOutputs
from hybridflow.workers.micro_batches import micro_batches
from hybridflow.workers.training import Trainer
from hybridflow.workers.varlen_attention import use_varlen_attention


MODES = ("rows", "budget", "packed")


def pg_loss_for(packed: bool):
    def pg_loss(model, micro, tokens, seqs):
        out = PolicyOutputs(model, micro, tokens, seqs, packed=packed)
        loss = out.mean(-out.log_probs * micro["advantages"])
        return loss, {"loss": loss.detach()}
    return pg_loss


def step_seconds(trainer, batch, rows: int, max_tokens, packed: bool) -> float:
    start = time.perf_counter()
    trainer.train(batch, pg_loss_for(packed), epochs=1, mini_batch_size=len(batch),
                  micro_batch_size=rows, max_tokens=max_tokens, packed=packed)
    return time.perf_counter() - start


def make_model(size: str, mode: str):
    """`packed`: per-sequence sdpa (`sdpa_varlen`); `packed-dense`: transformers' sdpa
    with its dense [T, T] block-diagonal mask, for what that attention costs."""
    model = workload.make_model(size)
    if mode == "packed":
        use_varlen_attention(model)
    return model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="5m")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--max-response", type=int, default=256)
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--dense", action="store_true",
                        help="also packed with the dense block-diagonal mask")
    args = parser.parse_args()
    modes = MODES + (("packed-dense",) if args.dense else ())
    torch.set_num_threads(1)
    batch = workload.make_rollout(args.prompts, args.n, args.max_response)
    width = batch["input_ids"].shape[1]
    budget = args.rows * width
    cfg = ActorConfig(lr=1e-6, mini_batch_size=len(batch), micro_batch_size=args.rows)
    ctx = SimpleNamespace(distributed=False, world_size=1)
    trainers = {mode: Trainer(make_model(args.size, mode), cfg, ctx,
                              torch.device("cpu")) for mode in modes}
    limits = {"rows": None, "budget": budget, "packed": budget, "packed-dense": budget}
    valid = int(batch["attention_mask"].sum())
    cells = {mode: sum(len(m.index) * m.batch["input_ids"].shape[1]
                       for m in micro_batches(batch, args.rows, limits[mode]))
             for mode in ("rows", "budget")}
    cells["packed"] = valid
    times: dict[str, list[float]] = {mode: [] for mode in modes}
    for rep in range(args.reps + 1):
        k = rep % len(modes)
        for mode in modes[k:] + modes[:k]:
            seconds = step_seconds(trainers[mode], batch, args.rows, limits[mode],
                                   mode.startswith("packed"))
            if rep:
                times[mode].append(seconds)
            print(f"rep {rep} {mode:12s} {seconds:7.2f} s", flush=True)
    rows_s, budget_s, packed_s = (statistics.median(times[m]) for m in MODES)
    print(f"{len(batch)} rows, width {width}, budget {budget} tokens; token cells computed: "
          f"rows {cells['rows']}, budget {cells['budget']}, packed {cells['packed']} "
          f"(attended {valid})")
    print(f"update step: rows {rows_s:.2f} s, budget {budget_s:.2f} s, packed "
          f"{packed_s:.2f} s; speed-up budget {rows_s / budget_s:.2f}x, packed "
          f"{rows_s / packed_s:.2f}x (packed over budget {budget_s / packed_s:.2f}x)")
    if args.dense:
        dense_s = statistics.median(times["packed-dense"])
        print(f"packed with the dense block mask: {dense_s:.2f} s "
              f"({dense_s / packed_s:.2f}x the per-sequence attention's time)")


if __name__ == "__main__":
    main()
