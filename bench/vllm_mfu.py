"""The vLLM engine's generation against this machine's peak and against bare vLLM, in
one run (issue 37 item 2). Needs vLLM (run it in the environment .ci/vllm.sh makes):

    .venv-vllm/bin/python bench/vllm_mfu.py --model ~/.cache/hybridflow/smollm2-135m

One process, torch threads set (`--threads`; vLLM's CPU build binds its OpenMP threads
to the same cores). A round runs, in a rotating order, on the same `--prompts` chat
prompts (one sample each, `--new-tokens`, temperature 1): the matmul peak at the
model's dtype (core/device_peak.matmul_flops), the project's `actor.generate` with
`rollout.backend=vllm`, a bare `vllm.LLM.generate` on the same engine with the same
SamplingParams (bench/vllm_engine.timed_bare: no assembly, no weight check), and,
unless `--no-hf`, the HF engine's `actor.generate`. Per way: the median seconds,
generated tokens/s, model FLOPs (2 N per real prompt and generated token, N the
linear weights: workers/mfu.py), the MFU against the same run's median peak, the time
over the compute bound (1 / MFU), the MFU in CPU seconds (the work done, what a
loaded machine leaves readable at one thread), the worker's own `perf/mfu`, and the project's
tokens/s over bare vLLM's as the median of per-round ratios (its overhead). Prints a
table, writes bench/results/vllm_mfu.json (`--out`).
"""
from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.harness import machine, median, quiet_logs, set_threads, table, write_results

WAYS = ("project_vllm", "bare_vllm", "project_hf")


def actor_for(model: str, backend: str, dtype: str, rows: int, new_tokens: int,
              kv_cache_gib: float):
    from hybridflow.workers import ActorWorker
    cfg = {"model": {"path": model, "tokenizer": "auto", "device": "cpu", "dtype": dtype},
           "actor": {"lr": 1e-7, "mini_batch_size": rows, "micro_batch_size": rows},
           "rollout": {"backend": backend, "max_new_tokens": new_tokens,
                       "micro_batch_size": rows, "kv_cache_gib": kv_cache_gib,
                       "enforce_eager": True, "temperature": 1.0}}
    return ActorWorker(cfg)


class Ways:
    """The ways of generating the same rows, each call timed and its FLOPs counted."""

    def __init__(self, args, dtype: str):
        from bench.vllm_engine import prompt_rows
        from hybridflow.workers.mfu import matmul_params
        rows = args.prompts
        self.vllm = actor_for(args.model, "vllm", dtype, rows, args.new_tokens, args.kv_cache_gib)
        self.hf = None if args.no_hf else actor_for(args.model, "hf", dtype, rows,
                                                    args.new_tokens, args.kv_cache_gib)
        self.params = matmul_params(self.vllm.module)
        self.batch = prompt_rows(self.vllm.tokenizer, rows, chat=True)
        self.prompt_tokens = int(self.batch["attention_mask"].sum())
        self.w = {"n": 1, "tokens": args.new_tokens}
        self.runs: dict[str, list[dict]] = {w: [] for w in WAYS if w != "project_hf" or self.hf}
        self.run("project_vllm", record=False)  # builds the engine, first sync, warm-up
        self.run("bare_vllm", record=False)
        if self.hf:
            self.run("project_hf", record=False)

    def run(self, way: str, record: bool = True) -> None:
        from bench.vllm_engine import timed_bare
        from hybridflow.core.metric_names import MFU
        reported = float("nan")
        if way != "project_hf":  # each call prefills its prompts: none left cached
            with self.vllm.engine.state.entered():
                self.vllm.engine.llm.reset_prefix_cache()
        cpu = time.process_time()
        if way == "bare_vllm":
            seconds, tokens = timed_bare(self.vllm, self.batch, self.w)
        else:
            began = time.perf_counter()
            out = (self.vllm if way == "project_vllm" else self.hf).generate(
                self.batch, n=1, max_new_tokens=self.w["tokens"], temperature=1.0)
            seconds, tokens = time.perf_counter() - began, int(out["response_length"].sum())
            reported = out.meta["metrics"].get(MFU, float("nan"))
        if record:
            flops = 2 * self.params * (self.prompt_tokens + tokens)
            self.runs[way].append({"s": seconds, "cpu_s": time.process_time() - cpu,
                                   "tokens": tokens, "model_flops": flops,
                                   "worker_reported_mfu": reported})


def run(args) -> dict:
    import vllm
    from hybridflow.core.device_peak import matmul_flops
    quiet_logs()
    set_threads(args.threads)  # before the build: vLLM's side starts from the trainer's
    ways = Ways(args, args.dtype)
    dtype = ways.vllm.trainer.backend.compute_dtype
    peaks: list[float] = []
    steps = ["peak", *ways.runs]
    for i in range(args.reps):  # one of each in turn, who goes first rotating
        k = i % len(steps)
        for what in steps[k:] + steps[:k]:
            if what == "peak":
                peaks.append(matmul_flops(dtype=dtype, repeats=3))
            else:
                ways.run(what)
    ways.vllm.engine.close()
    peak = median(peaks)
    payload = {"machine": machine(), "vllm": vllm.__version__, "model": args.model,
               "dtype": str(dtype).removeprefix("torch."), "prompts": args.prompts,
               "new_tokens": args.new_tokens, "reps": args.reps, "matmul_params": ways.params,
               "engine_matmul_params": ways.vllm.engine.matmul_params,
               "prompt_tokens": ways.prompt_tokens, "peak_flops": peak, "peaks": peaks,
               "load_avg_1m_at_end": os.getloadavg()[0], "threads": args.threads,
               "runs": ways.runs, "rows": []}
    bare = ways.runs["bare_vllm"]
    for way, runs in ways.runs.items():
        seconds, flops = median([r["s"] for r in runs]), median([r["model_flops"] for r in runs])
        payload["rows"].append({
            "way": way, "seconds": seconds, "tokens": median([r["tokens"] for r in runs]),
            "tokens_per_s": median([r["tokens"] / r["s"] for r in runs]),
            "model_flops": flops, "mfu": median([r["model_flops"] / r["s"] / peak for r in runs]),
            "over_compute_bound": median([r["s"] * peak / r["model_flops"] for r in runs]),
            # the work done: CPU seconds (one torch thread: robust to a loaded machine)
            "cpu_s": median([r["cpu_s"] for r in runs]),
            "mfu_cpu_time": median([r["model_flops"] * args.threads / r["cpu_s"] / peak
                                    for r in runs]),
            "worker_reported_mfu": median([r["worker_reported_mfu"] for r in runs]),
            # per round: this way's tokens/s over bare vLLM's in the same round
            "over_bare_tokens_per_s": median([(r["tokens"] / r["s"]) / (b["tokens"] / b["s"])
                                              for r, b in zip(runs, bare)])})
    payload["results"] = write_results("vllm_mfu", payload, args.out)
    return payload


def report(payload: dict) -> str:
    head = (f"{os.path.basename(payload['model'].rstrip('/'))} {payload['dtype']}, "
            f"{payload['prompts']} prompts x {payload['new_tokens']} new tokens, matmul peak "
            f"(median of {payload['reps']}) {payload['peak_flops'] / 1e9:.1f} GFLOP/s, "
            f"N = {payload['matmul_params'] / 1e6:.1f} M (vLLM counts "
            f"{payload['engine_matmul_params'] / 1e6:.1f} M)")
    rows = [[r["way"], r["seconds"], r["cpu_s"], r["tokens"], r["tokens_per_s"],
             r["model_flops"] / 1e9, r["mfu"], r["mfu_cpu_time"], r["worker_reported_mfu"],
             r["over_compute_bound"], r["over_bare_tokens_per_s"]] for r in payload["rows"]]
    return head + "\n" + table(["way", "s", "CPU s", "tokens", "tok/s", "GFLOP", "MFU",
                                "MFU (CPU s)", "perf/mfu (worker)", "x compute bound",
                                "tok/s / bare vLLM"], rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=os.environ.get("HYBRIDFLOW_SMOLLM2_DIR"),
                        help="an HF model directory (default: HYBRIDFLOW_SMOLLM2_DIR)")
    parser.add_argument("--dtype", default="fp32", help="model.dtype (fp32, bf16, auto)")
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=48)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--kv-cache-gib", type=float, default=1.0)
    parser.add_argument("--no-hf", action="store_true", help="skip the HF engine's row")
    parser.add_argument("--out", help="JSON path (default bench/results/vllm_mfu.json)")
    args = parser.parse_args()
    if not args.model or not os.path.isfile(os.path.join(args.model, "config.json")):
        parser.error(f"--model {args.model}: no config.json there (an HF model directory, "
                     "or set HYBRIDFLOW_SMOLLM2_DIR)")
    print(report(run(args)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
