"""The `hf` engine's `rollout.generate` against its compute bound, old path and new,
alternated in one run (issue 37 item 2).

    python bench/generate_speed.py                                   # the toy model
    python bench/generate_speed.py --model $HYBRIDFLOW_SMOLLM2_DIR --data data/word_arith \\
        --prompts 8 --n 4 --new-tokens 48 --reps 3 --threads 2

Variants, one of each per round in a rotating order (bench/harness.py `alternate`):
- `hf_generate`: the engine as it was, HF `generate` with the log-prob recorder
  (`HFEngine._hf_generate`, still the path of ranks that decode in lockstep);
- `engine`: the engine's own decode loop (workers/rollout/hf_decode.py);
- `stream` (with `--stream`): the same prompts through the engine's streaming calls
  (`submit`, then `poll` until drained: workers/rollout/stream.py's continuous
  batching, `--slots` decode slots, all rows by default), as `trainer.async_mode=
  streaming` generates; its tokens/s against `engine`'s is the stream loop's cost.
  `--batches K`: every variant generates the rows K times, the stream with all K
  batches' requests queued at once (slots refilled as rows end, as a stream k batches
  ahead runs), the others one batch after another;
- `peak`: this process's fp32 matmul rate (core/device_peak.py `matmul_flops`), so
  each generate is compared with the peak measured beside it.
Model FLOPs as the workers count them (workers/mfu.py): 2 N per real prompt token and
per generated token, N the linear layers' weights. The compute bound is those FLOPs
over the median peak; `x bound` is the median seconds over it (target: <= 1.5).
The machine is shared: each round records /proc/loadavg; read the ratios, which
are taken in the same run. Prints a table, writes bench/results/generate_speed.json.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.harness import machine, median, quiet_logs, set_threads, table, write_results

TOY = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                   "graphs", "assets", "toy_base")
PROMPTS = ["12+30=", "7*8=", "99-1=", "5+5=", "123+456=", "9*9=", "40-2=", "3+4="]
TARGET = 1.5


def prompt_texts(tokenizer, data: str | None, prompts: int) -> list[str]:
    """The data file's first chat prompts with the generation prompt, or toy sums."""
    if not data:
        return [PROMPTS[i % len(PROMPTS)] for i in range(prompts)]
    with open(os.path.join(data, "train.jsonl")) as fh:
        rows = [json.loads(line) for line, _ in zip(fh, range(prompts))]
    return [tokenizer.apply_chat_template(r["prompt"], tokenize=False,
                                          add_generation_prompt=True) for r in rows]


def build(model: str, data: str | None, prompts: int, n: int):
    """(engine, the old path's engine, repeated prompt rows)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from hybridflow.core.batch import Batch
    from hybridflow.workers.rollout.hf import HFEngine
    tok = AutoTokenizer.from_pretrained(model)
    tok.padding_side = "left"
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    module = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32)
    module.eval().requires_grad_(False)
    enc = tok(prompt_texts(tok, data, prompts), padding=True, return_tensors="pt")
    rows = Batch({"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"]},
                 {"uid": [f"p{i}" for i in range(len(enc["input_ids"]))]})  # a stream's rows

    class HFGenerate(HFEngine):
        _own_loop = False  # the old path, selectable only here

    new = HFEngine(module, tok, "cpu", shares_module=False, version=0)
    old = HFGenerate(module, tok, "cpu", shares_module=False, version=0)
    return new, old, rows.repeat(n, interleave=True)


def run(args) -> dict:
    import torch
    from hybridflow.core.device_peak import matmul_flops
    from hybridflow.workers.config import RolloutConfig
    from hybridflow.workers.mfu import matmul_params
    new, old, rows = build(args.model, args.data, args.prompts, args.n)
    opts = RolloutConfig(n=args.n, max_new_tokens=args.new_tokens, temperature=1.0,
                         micro_batch_size=len(rows))
    params, prompt_tokens = matmul_params(new.module), int(rows["attention_mask"].sum())
    record = {"hf_generate": [], "engine": [], "peak": []}
    stream_opts = dataclasses.replace(opts, micro_batch_size=args.slots or len(rows))

    packed_opts = dataclasses.replace(opts, prepacked_linear=True)

    def timed(name, engine, how=opts):
        began, cpu = time.perf_counter(), time.process_time()
        outs = [streamed(engine)] if name == "stream" else \
            [engine.generate(rows, how) for _ in range(args.batches)]
        seconds = time.perf_counter() - began
        generated = sum(int(out["response_length"].sum()) for out in outs)
        record[name].append({"s": seconds, "cpu_s": time.process_time() - cpu,
                             "generated": generated, "load": os.getloadavg()[0],
                             "flops": 2 * params * (args.batches * prompt_tokens + generated)})

    def streamed(engine):
        from hybridflow.core.batch import Batch
        for _ in range(args.batches):
            engine.submit(rows, stream_opts)
        parts = []
        while engine.stream_busy:
            part = engine.poll(8)
            if part is not None:
                parts.append(part)
        return Batch.concat(parts)

    variants = {"hf_generate": lambda: timed("hf_generate", old),
                "engine": lambda: timed("engine", new),
                "peak": lambda: record["peak"].append(matmul_flops())}
    if args.stream:
        record["stream"] = []
        variants["stream"] = lambda: timed("stream", new)
    if args.prepacked:  # the own loop with rollout.prepacked_linear (workers/rollout/prepacked.py)
        record["prepacked"] = []
        variants["prepacked"] = lambda: timed("prepacked", new, packed_opts)
    torch.manual_seed(0)
    for _ in range(args.warmup):
        for name in [n for n in ("engine", "stream", "prepacked") if n in variants]:
            variants[name]()
            record[name].clear()
    names = list(variants)
    for rep in range(args.reps):
        order = names[rep % len(names):] + names[:rep % len(names)]
        for name in order:
            variants[name]()
    return summarize(record, args, params, prompt_tokens, len(rows))


def summarize(record: dict, args, params: int, prompt_tokens: int, rows: int) -> dict:
    peak = median(record["peak"])
    out = {"settings": {"model": args.model, "rows": rows, "new_tokens": args.new_tokens,
                        "prompt_tokens": prompt_tokens, "matmul_params": params,
                        "reps": args.reps, "threads": args.threads,
                        "stream_slots": args.slots or rows if args.stream else None,
                        "batches": args.batches},
           "peak_gflops": peak / 1e9, "peaks_gflops": [p / 1e9 for p in record["peak"]],
           "variants": {}}
    for name in [n for n in ("hf_generate", "engine", "stream", "prepacked") if n in record]:
        reps = record[name]
        seconds = median([r["s"] for r in reps])
        flops = median([r["flops"] for r in reps])
        out["variants"][name] = {
            "s": seconds, "tokens_per_s": median([r["generated"] / r["s"] for r in reps]),
            "gflops": flops / seconds / 1e9, "x_bound": seconds / (flops / peak),
            "reps": reps}
    out["speedup"] = out["variants"]["hf_generate"]["s"] / out["variants"]["engine"]["s"]
    if "stream" in record:  # per repetition: the ratio within a round, then the median
        rounds = zip(record["stream"], record["engine"])
        out["stream_vs_engine"] = median([(s["generated"] / s["s"]) / (e["generated"] / e["s"])
                                          for s, e in rounds])
        rounds = zip(record["stream"], record["engine"])  # per CPU second: load-proof
        out["stream_vs_engine_cpu"] = median([(s["generated"] / s["cpu_s"])
                                              / (e["generated"] / e["cpu_s"]) for s, e in rounds])
    if "prepacked" in record:  # seconds per generated token, within a round
        out["prepacked_speedup"] = median([(e["s"] / e["generated"]) / (p["s"] / p["generated"])
                                           for p, e in zip(record["prepacked"],
                                                           record["engine"])])
    return out


def report(res: dict) -> str:
    rows = [[name, v["s"], v["tokens_per_s"], v["gflops"], v["x_bound"]]
            for name, v in res["variants"].items()]
    head = (f"{res['settings']['rows']} rows x {res['settings']['new_tokens']} new tokens, "
            f"{res['settings']['threads']} threads, fp32 peak {res['peak_gflops']:.1f} GFLOP/s "
            f"(median of {len(res['peaks_gflops'])}), "
            f"load {res['machine']['load_avg_1m_at_start']}")
    return "\n".join([head, table(["path", "s", "tokens/s", "GFLOP/s", "x bound"], rows),
                      f"engine over hf_generate: {res['speedup']:.2f}x faster; "
                      f"target: x bound <= {TARGET}"]
                     + ([f"stream tokens/s over engine's (median of rounds): "
                         f"{res['stream_vs_engine']:.2f} wall-clock, "
                         f"{res['stream_vs_engine_cpu']:.2f} per CPU second"]
                        if "stream_vs_engine" in res else [])
                     + ([f"prepacked over engine (s per generated token, median of rounds): "
                         f"{res['prepacked_speedup']:.2f}x faster"]
                        if "prepacked_speedup" in res else []))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default=TOY)
    parser.add_argument("--data", default=None, help="a word_arith folder: its chat prompts")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--new-tokens", type=int, default=48)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--stream", action="store_true",
                        help="also the streaming loop (submit/poll) on the same prompts")
    parser.add_argument("--batches", type=int, default=1,
                        help="generate the rows this many times a variant (the stream: "
                             "all queued at once)")
    parser.add_argument("--slots", type=int, default=0,
                        help="the stream's decode slots (default: every row)")
    parser.add_argument("--prepacked", action="store_true",
                        help="also the own loop with rollout.prepacked_linear (oneDNN)")
    parser.add_argument("--out", default=None, help="the JSON file (default: bench/results/)")
    args = parser.parse_args(argv)
    quiet_logs()
    set_threads(args.threads)
    res = run(args)
    res["machine"] = machine()
    res["machine"]["loadavg_at_end"] = open("/proc/loadavg").read().split()[:3]
    print(report(res))
    print("wrote", write_results("generate_speed", res, args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
