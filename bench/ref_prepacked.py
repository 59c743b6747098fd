"""The reference's log-prob pass with and without `ref.prepacked_linear` (oneDNN's
packed linear kernel, workers/rollout/prepacked.py), on one rollout, alternated.

    HYBRIDFLOW_SMOLLM2_DIR=DIR python bench/ref_prepacked.py [--rows 32] [--width 96]
    python bench/ref_prepacked.py --model toy

Two ReferenceWorkers of the same float32 model in one process (torch threads set:
`--threads`), one packed; each `logprob` call scores the same `--rows` rows of
`--width` tokens (the second half a response). Reports the median seconds of each,
the ratio, and the largest difference of their log-probs; writes
bench/results/ref_prepacked.json.
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from bench.harness import (alternate, machine, median, quiet_logs, set_threads, table,
                           write_results)


def rollout(vocab: int, rows: int, width: int, seed: int = 0):
    import torch

    from hybridflow.core.batch import Batch
    gen = torch.Generator().manual_seed(seed)
    response = width // 2
    ids = torch.randint(3, vocab, (rows, width), generator=gen)
    mask = torch.ones(rows, width, dtype=torch.long)
    return Batch({"input_ids": ids, "attention_mask": mask,
                  "position_ids": torch.arange(width).expand(rows, width).clone(),
                  "responses": ids[:, -response:].clone(),
                  "response_mask": torch.ones(rows, response, dtype=torch.long)})


def workers(model: str, rows: int):
    from hybridflow.workers import ReferenceWorker
    if model == "toy":
        base = {"model": {"device": "cpu", "dtype": "float32"}}
    else:
        base = {"model": {"path": model, "tokenizer": "auto", "device": "cpu",
                          "dtype": "float32"}}

    def make(packed: bool):
        return ReferenceWorker({**base, "ref": {"micro_batch_size": rows,
                                                "prepacked_linear": packed}})
    return make(False), make(True)


def run(model: str, rows: int, width: int, reps: int, threads: int) -> dict:
    set_threads(threads)
    plain, packed = workers(model, rows)
    batch = rollout(plain.module.config.vocab_size, rows, width)
    out = {}

    def call(name, worker):
        def go():
            out[name] = worker.logprob(batch)["ref_log_prob"]
        return go
    times = alternate({"F.linear": call("F.linear", plain), "prepacked": call("prepacked", packed)},
                      reps, warmup=1)
    diff = float((out["F.linear"] - out["prepacked"]).abs().max())
    seconds = {name: median(t) for name, t in times.items()}
    return {"machine": machine(), "model": model, "rows": rows, "width": width,
            "reps": reps, "seconds": seconds, "times": times, "max_abs_logp_diff": diff,
            "speedup": seconds["F.linear"] / seconds["prepacked"]}


def report(payload: dict) -> str:
    rows = [[name, s] for name, s in payload["seconds"].items()]
    return (table(["ref.logprob linear layers", "median s"], rows)
            + f"\nprepacked speedup {payload['speedup']:.2f}x; largest |log-prob diff| "
              f"{payload['max_abs_logp_diff']:.2e}")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=os.environ.get("HYBRIDFLOW_SMOLLM2_DIR") or "toy")
    parser.add_argument("--rows", type=int, default=32)
    parser.add_argument("--width", type=int, default=96)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    quiet_logs()
    payload = run(args.model, args.rows, args.width, args.reps, args.threads)
    print(report(payload))
    print(f"\nwrote {write_results('ref_prepacked', payload, args.out)}")


if __name__ == "__main__":
    main()
