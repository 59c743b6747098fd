"""Each phase against this machine's peak, in one run (issue 37 item 2): the field's MFU.

    python bench/mfu.py                        # the toy model (graphs/assets/toy_base)
    HYBRIDFLOW_SMOLLM2_DIR=DIR python bench/mfu.py --prompts 8 --n 4 --new-tokens 48

One process, torch threads set (`--threads`). A round measures, one after the other in
a rotating order: the matmul peak (fp32 at `PEAK_SIZE`, and bf16), and the actor's
phases on one batch (HF engine `generate`, `logprob`, `update`) at fp32, and at bf16
where it is native (an AVX-512 BF16/AMX CPU or a CUDA device; elsewhere bf16 is
emulated and only its peak is reported). Each phase's model FLOPs are the ones the
workers report `perf/mfu/<node>` with (hybridflow/workers/mfu.py: 2 N per token of a
forward, 6 N of an update, 2 N per prompt and generated token of generation; N the
linear layers' weights, real tokens only). Per phase and dtype: the median seconds,
the achieved GFLOP/s, the ratio to the same run's median peak (the MFU) and, for
generation, its time over its compute bound (1 / MFU). The peaks are medians over
rounds, so a phase is compared with the peak measured beside it, not on a quiet
moment. Prints a table, writes bench/results/mfu.json (`--out`).
"""
from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.harness import machine, median, quiet_logs, set_threads, table, write_results

TOY = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                   "graphs", "assets", "toy_base")
PHASES = ("generate", "logprob", "update")
PROMPTS = ["12+30=", "7*8=", "99-1=", "5+5=", "123+456=", "9*9=", "40-2=", "3+4="]


def actor_for(model: str, dtype: str, rows: int, new_tokens: int):
    from hybridflow.workers import ActorWorker
    cfg = {"model": {"path": model, "tokenizer": "auto", "device": "cpu", "dtype": dtype},
           "actor": {"lr": 1e-7, "mini_batch_size": rows, "micro_batch_size": rows},
           "rollout": {"max_new_tokens": new_tokens, "micro_batch_size": rows,
                       "log_prob_micro_batch_size": rows}}
    return ActorWorker(cfg)


def prompt_batch(tokenizer, prompts: int):
    from hybridflow.core.batch import Batch
    texts = [PROMPTS[i % len(PROMPTS)] for i in range(prompts)]
    enc = tokenizer(texts, padding=True, return_tensors="pt")
    return Batch({"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"]},
                 {"uid": [f"u{i}" for i in range(prompts)]})


class Phases:
    """The actor's three phases on one batch, each call timed and its FLOPs counted."""

    def __init__(self, actor, prompts: int, n: int):
        import torch
        from hybridflow.workers.mfu import matmul_params
        self.actor, self.n, self.params = actor, n, matmul_params(actor.module)
        self.prompts = prompt_batch(actor.tokenizer, prompts)
        torch.manual_seed(0)
        self.rollout = actor.generate(self.prompts, n=n)
        self.rollout = self.rollout.union(actor.logprob(self.rollout))
        self.rollout["advantages"] = torch.randn(self.rollout["responses"].shape,
                                                 generator=torch.Generator().manual_seed(0))
        self.seconds: dict[str, list[float]] = {p: [] for p in PHASES}
        self.cpu_seconds: dict[str, list[float]] = {p: [] for p in PHASES}
        self.flops: dict[str, list[float]] = {p: [] for p in PHASES}
        self.reported: dict[str, list[float]] = {p: [] for p in PHASES}

    def run(self, phase: str) -> None:
        from hybridflow.core.metric_names import MFU
        from hybridflow.workers.mfu import FORWARD, TRAIN, real_tokens
        began, cpu = time.perf_counter(), time.process_time()
        if phase == "generate":
            out = self.actor.generate(self.prompts, n=self.n)
            flops = FORWARD * self.params * real_tokens(out)
        elif phase == "logprob":
            out = self.actor.logprob(self.rollout)
            flops = FORWARD * self.params * real_tokens(self.rollout)
        else:
            out = self.actor.update(self.rollout)
            flops = TRAIN * self.params * real_tokens(self.rollout)
        self.seconds[phase].append(time.perf_counter() - began)
        self.cpu_seconds[phase].append(time.process_time() - cpu)
        self.flops[phase].append(flops)
        self.reported[phase].append(out.meta.get("metrics", {}).get(MFU, float("nan")))


def measure_peak(dtype_name: str) -> float:
    import torch
    from hybridflow.core.device_peak import matmul_flops
    return matmul_flops(dtype=getattr(torch, dtype_name), repeats=3)


def run(model: str = TOY, prompts: int = 8, n: int = 4, new_tokens: int = 16, reps: int = 3,
        threads: int = 2, out: str | None = None, quiet: bool = False) -> dict:
    from hybridflow.workers.models import native_bf16, resolve_dtype
    quiet_logs()
    set_threads(threads)
    dtypes = ["float32"] + (["bfloat16"] if native_bf16() else [])
    phases = {d: Phases(actor_for(model, d, prompts * n, new_tokens), prompts, n)
              for d in dtypes}
    peaks: dict[str, list[float]] = {"float32": [], "bfloat16": []}
    steps = [("peak", d) for d in peaks] + [(p, d) for d in dtypes for p in PHASES]
    for i in range(reps):  # one of each in turn, who goes first rotating
        k = i % len(steps)
        for what, dtype in steps[k:] + steps[:k]:
            if what == "peak":
                peaks[dtype].append(measure_peak(dtype))
            else:
                phases[dtype].run(what)
    payload = {"machine": machine(), "model": model, "prompts": prompts, "n": n,
               "new_tokens": new_tokens, "reps": reps, "threads": threads,
               "native_bf16": native_bf16(),
               "auto_dtype": str(resolve_dtype("auto")).removeprefix("torch."),
               "peak_flops": {d: median(v) for d, v in peaks.items()}, "rows": []}
    for dtype in dtypes:
        peak = payload["peak_flops"][dtype]
        for phase in PHASES:
            seconds = median(phases[dtype].seconds[phase])
            flops = median(phases[dtype].flops[phase])
            payload["rows"].append({
                "dtype": dtype, "phase": phase, "seconds": seconds, "model_flops": flops,
                "achieved_flops": flops / seconds, "mfu": flops / seconds / peak,
                "worker_reported_mfu": median(phases[dtype].reported[phase]),
                # the work done (CPU seconds of the process): readable on a loaded machine
                # at one thread, where the wall clock is mostly waiting for a core
                "cpu_seconds": median(phases[dtype].cpu_seconds[phase]),
                "mfu_cpu_time": flops * threads / median(phases[dtype].cpu_seconds[phase])
                / peak,
                "over_compute_bound": seconds / (flops / peak)})
    payload["results"] = write_results("mfu", payload, out)
    if not quiet:
        print(report(payload))
    return payload


def report(payload: dict) -> str:
    peaks = payload["peak_flops"]
    head = (f"matmul peak (median of {payload['reps']}): fp32 "
            f"{peaks['float32'] / 1e9:.1f} GFLOP/s, bf16 {peaks['bfloat16'] / 1e9:.1f} GFLOP/s"
            f" ({'native' if payload['native_bf16'] else 'emulated: phases at fp32 only'});"
            f" model.dtype=auto picks {payload.get('auto_dtype', '?')} here")
    rows = [[r["dtype"], r["phase"], r["seconds"], r["cpu_seconds"], r["model_flops"] / 1e9,
             r["achieved_flops"] / 1e9, r["mfu"], r["mfu_cpu_time"], r["worker_reported_mfu"],
             r["over_compute_bound"]] for r in payload["rows"]]
    return head + "\n" + table(["dtype", "phase", "s", "CPU s", "GFLOP", "GFLOP/s", "MFU",
                                "MFU (CPU s)", "perf/mfu (worker)", "x compute bound"], rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=os.environ.get("HYBRIDFLOW_SMOLLM2_DIR") or TOY,
                        help="an HF model directory (default: HYBRIDFLOW_SMOLLM2_DIR, else "
                             "the toy model)")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--new-tokens", type=int, default=16)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", help="JSON path (default bench/results/mfu.json)")
    args = parser.parse_args()
    if not os.path.isfile(os.path.join(args.model, "config.json")):
        parser.error(f"--model {args.model}: no config.json there (an HF model directory)")
    run(args.model, args.prompts, args.n, args.new_tokens, args.reps, args.threads, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
