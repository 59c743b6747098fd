"""Peak memory and seconds of one `actor.update` (and one `actor.logprob`) on a long
row, with the log-probs computed from whole logits (`actor.logprob_chunk=0`) and a
chunk at a time (the default, `workers/chunked_logprobs.py`).

The model: a 2-layer Qwen2 with SmolLM2-135M's vocabulary (49,152) and a hidden size
of 256, random weights (no download), float32: small enough to train a 4K-token row
on two CPU cores, with a vocabulary whose logits dominate the pass as they do for a
real model at long lengths. The batch: one row of 64 prompt and R response tokens.
The chunked variant goes through `workers/head_logprobs.py`'s autograd Function (the
head here is a plain linear layer): one head matmul recomputed per chunk.

Ordinary micro-batches (`--micro`, also in the full run): seconds of one update on 8
rows of 64 prompt + 150 response tokens (1,200 response positions, more than the
341-position chunk of 2**24 logits), `actor.logprob_chunk` at its default and at a
2**26-logit chunk (1,365 positions: one chunk at 8 rows; `--micro-rows 16`: two)
against 0, alternated, with the median of the per-round ratios (robust to the shared
machine's load drifting between rounds); on the 2-layer model above and on SmolLM2-135M's own
shapes (30 layers, hidden 576; random weights), where the head is a small share of the
update.

Memory: each (pass, length, variant) runs in a fresh process, which builds the
worker, runs the pass once (AdamW allocates its moments at the first step), then
measures the second call: the allocator's peak above what was live before it (torch's
profiler, `profile_memory=True`: tensor storage only) and the growth of the peak RSS
(VmHWM, reset before the call). `check --memory`'s prediction of the same pass
(`hybridflow.memory.roles.actor_pass_memory`) is printed beside it. Time: both
variants in one process, alternated (`bench.harness.alternate`), torch threads set.

    python bench/chunked_logprobs.py            # R = 1024 and 4096 -> results JSON
    python bench/chunked_logprobs.py --quick    # R = 1024 only, fewer repeats
    python bench/chunked_logprobs.py --micro    # the micro-batch records only
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.harness import (alternate, machine, median, peak_rss_bytes, quiet_logs,
                           reset_peak_rss, rss_bytes, set_threads, table, write_results)

MIB = 2 ** 20
PROMPT = 64
VOCAB = 49152  # SmolLM2-135M's
HF_CONFIG = {"model_type": "qwen2", "hidden_size": 256, "intermediate_size": 768,
             "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
             "vocab_size": VOCAB, "tie_word_embeddings": True,
             "max_position_embeddings": 8192, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
             "pad_token_id": 0, "eos_token_id": 1, "bos_token_id": 2}
VARIANTS = {"whole": 0, "chunked": None}  # actor.logprob_chunk: 0 never, None the default
# SmolLM2-135M's shapes (bench/parallel.py's), random weights
SMOLLM2 = {"model_type": "llama", "hidden_size": 576, "intermediate_size": 1536,
           "num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3,
           "vocab_size": VOCAB, "tie_word_embeddings": True,
           "max_position_embeddings": 8192, "rms_norm_eps": 1e-5, "rope_theta": 100000.0,
           "pad_token_id": 0, "eos_token_id": 1, "bos_token_id": 2}
MICRO_ROWS, MICRO_RESPONSE = 8, 150
# actor.logprob_chunk of the micro-batch runs: the default (2**24 logits a chunk), the
# positions of a 2**26-logit chunk (the larger default weighed in docs/workers.md), never
MICRO_VARIANTS = {"default": None, "2**26": (1 << 26) // VOCAB, "whole": 0}


def run_config(response: int, chunk: int | None, rows: int = 1,
               hf_config: dict | None = None) -> dict:
    return {"model": {"hf_config": dict(hf_config or HF_CONFIG), "device": "cpu"},
            "actor": {"micro_batch_size": rows, "mini_batch_size": rows, "lr": 1e-6,
                      "logprob_chunk": chunk},
            "rollout": {"max_new_tokens": response, "log_prob_micro_batch_size": rows,
                        "n": 1},
            "data": {"max_prompt_length": PROMPT, "batch_size": rows}}


def long_row(response: int, rows: int = 1):
    """`rows` rows of PROMPT + response tokens with what actor.update reads."""
    import torch

    from hybridflow.core.batch import Batch
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(3, VOCAB, (rows, PROMPT + response), generator=gen)
    mask = torch.ones_like(ids)
    return Batch({"input_ids": ids, "attention_mask": mask,
                  "position_ids": torch.arange(PROMPT + response).expand(rows, -1),
                  "responses": ids[:, PROMPT:], "response_mask": mask[:, PROMPT:],
                  "old_log_probs": torch.zeros(rows, response),
                  "ref_log_prob": torch.zeros(rows, response),
                  "advantages": torch.randn(rows, response, generator=gen)},
                 {"uid": [f"u{i}" for i in range(rows)]})


def _call(worker, kind: str, batch):
    return (lambda: worker.update(batch)) if kind == "update" else \
        (lambda: worker.logprob(batch))


def child(kind: str, response: int, variant: str) -> dict:
    """This process's measurement of one pass (run by `measure` in a fresh process)."""
    import gc

    from bench.memory import cpu_peak_of
    from hybridflow.memory.roles import actor_pass_memory
    from hybridflow.workers.actor import ActorWorker
    set_threads(1)
    quiet_logs()
    cfg = run_config(response, VARIANTS[variant])
    worker, batch = ActorWorker(cfg), long_row(response)
    call = _call(worker, kind, batch)
    call()
    gc.collect()
    reset_peak_rss()
    rss_before = rss_bytes()
    allocator = cpu_peak_of(call)
    rss_peak = peak_rss_bytes() - rss_before
    predicted = actor_pass_memory(cfg, kind, rows=1)
    return {"allocator_peak_mib": allocator / MIB, "rss_peak_growth_mib": rss_peak / MIB,
            "predicted_logits_mib": predicted.get("logits", 0) / MIB,
            "predicted_transient_mib": sum(v for k, v in predicted.items()
                                           if k not in ("weights", "optimizer")) / MIB}


def measure(kind: str, response: int, variant: str) -> dict:
    out = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", kind,
                          str(response), variant], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def seconds(kind: str, response: int, reps: int) -> dict[str, float]:
    from hybridflow.workers.actor import ActorWorker
    batch = long_row(response)
    calls = {name: _call(ActorWorker(run_config(response, chunk)), kind, batch)
             for name, chunk in VARIANTS.items()}
    times = alternate(calls, reps, warmup=1)
    return {name: median(values) for name, values in times.items()}


def micro_seconds(name: str, hf_config: dict, reps: int, rows: int = MICRO_ROWS) -> dict:
    """Alternated seconds of one update on a MICRO_ROWS x MICRO_RESPONSE micro-batch
    under each of MICRO_VARIANTS, with the positions per chunk each resolved to."""
    from hybridflow.workers.actor import ActorWorker
    from hybridflow.workers.chunked_logprobs import chunk_positions
    batch = long_row(MICRO_RESPONSE, rows)
    workers = {v: ActorWorker(run_config(MICRO_RESPONSE, chunk, rows, hf_config))
               for v, chunk in MICRO_VARIANTS.items()}
    chunks = {v: chunk_positions(MICRO_VARIANTS[v], w.module, batch["responses"].numel())
              for v, w in workers.items()}
    times = alternate({v: _call(w, "update", batch) for v, w in workers.items()}, reps,
                      warmup=1)
    secs = {v: median(t) for v, t in times.items()}
    paired = {v: [d / w for d, w in zip(times[v], times["whole"])] for v in times}
    return {"model": name, "rows": rows, "response": MICRO_RESPONSE, "chunk": chunks,
            "seconds": secs, "all_seconds": times, "round_ratios": paired["default"],
            "ratio": median(paired["default"]), "round_ratios_2**26": paired["2**26"],
            "ratio_2**26": median(paired["2**26"])}


def micro_records(reps: int, rows: int = MICRO_ROWS) -> list[dict]:
    records = []
    for name, hf_config in (("2-layer", HF_CONFIG), ("SmolLM2-135M", SMOLLM2)):
        record = micro_seconds(name, hf_config, reps, rows)
        print(f"micro {name}: {json.dumps(record)}", flush=True)
        records.append(record)
    print(table(["model", "rows", "chunk (default)", "chunk 2**26", "s default", "s 2**26",
                 "s whole", "default / whole (median of rounds)", "2**26 / whole"],
                [[r["model"], r["rows"], r["chunk"]["default"], r["chunk"]["2**26"],
                  r["seconds"]["default"], r["seconds"]["2**26"], r["seconds"]["whole"],
                  r["ratio"], r["ratio_2**26"]] for r in records]))
    return records


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--micro", action="store_true", help="the micro-batch records only")
    parser.add_argument("--micro-rows", type=int, default=MICRO_ROWS,
                        help=f"rows of {MICRO_RESPONSE} response tokens in the micro-batch")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--child", nargs=3, metavar=("KIND", "RESPONSE", "VARIANT"))
    args = parser.parse_args()
    if args.child:
        kind, response, variant = args.child
        print(json.dumps(child(kind, int(response), variant)))
        return
    quiet_logs()
    threads = set_threads(args.threads)
    lengths, reps = ((1024,), 2) if args.quick else ((1024, 4096), 3)
    if args.micro:
        lengths, reps = (), 5
    rows, records = [], []
    for kind in ("update", "logprob"):
        for response in lengths:
            mem = {v: measure(kind, response, v) for v in VARIANTS}
            secs = seconds(kind, response, reps)
            record = {"pass": kind, "response": response, "memory": mem, "seconds": secs,
                      "time_ratio": secs["chunked"] / secs["whole"]}
            records.append(record)
            rows.append([kind, response] + [mem[v]["allocator_peak_mib"] for v in VARIANTS]
                        + [mem[v]["rss_peak_growth_mib"] for v in VARIANTS]
                        + [mem[v]["predicted_transient_mib"] for v in VARIANTS]
                        + [secs["whole"], secs["chunked"], record["time_ratio"]])
            print(f"{kind} R={response}: {json.dumps(record)}", flush=True)
    micro = micro_records(3 if args.quick else 5, args.micro_rows)
    print(table(["pass", "R", "peak MiB whole", "chunked", "RSS MiB whole", "chunked",
                 "predicted whole", "chunked", "s whole", "s chunked", "time ratio"], rows))
    name = "chunked_logprobs_micro" if args.micro else "chunked_logprobs"
    if args.micro_rows != MICRO_ROWS:
        name += f"_{args.micro_rows}rows"
    path = write_results(name, {
        "machine": machine(), "torch_threads": threads, "model": HF_CONFIG, "prompt": PROMPT,
        "reps": reps, "records": records, "micro": micro})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
