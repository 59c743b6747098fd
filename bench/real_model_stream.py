"""Streaming on the real model (SmolLM2-135M-Instruct, word_arith, the shipped config):
synchronous against `trainer.async_mode=streaming` on Ray with the rollout on a pool of
its own, the vLLM engine (or `--engine hf`).

    python bench/real_model_stream.py --model $HYBRIDFLOW_SMOLLM2_DIR [--steps 6]
                                      [--reps 1] [--staleness 2] [--engine vllm]

Each variant is one `hybridflow run graphs/grpo.py --config graphs/configs/
smollm2_arith.yaml` (bench/real_model_curve.shipped_run) with `runtime.name=ray`, the
rollout on pool `gen` and the actor on `main` (one worker each, `--threads` torch
threads each), no validation; repetitions alternate the variants (the first rotating).
From each run's metrics.jsonl, over the steps after `--warmup`: steps/s, the share of
the run each pool was busy (`perf/busy/<pool>`, from the recorded timeline), the
staleness histogram of the trained rows (streaming) and the engine's counters. The
ratio streaming / synchronous is taken within a repetition. Writes
bench/results/real_model_stream.json. Needs the model (`hybridflow model smollm2 --out
DIR`) and, for the vLLM engine, vLLM (`.ci/vllm.sh`'s environment).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.harness import machine, median, need_real_model, table, write_results
from bench.real_model_curve import make_data, run_env, shipped_run

SPLIT = ("runtime.name=ray", "placement.pools.gen.devices_per_node=1",
         "placement.roles.rollout=gen")
VLLM = ("rollout.backend=vllm", "rollout.enforce_eager=true", "rollout.kv_cache_gib=1")


def variant_overrides(name: str, k: int, engine: str, steps: int) -> list[str]:
    mode = (["trainer.async_mode=streaming", f"trainer.staleness={k}",
             "actor.off_policy=decoupled"] if name == "streaming" else [])
    return [*SPLIT, *(VLLM if engine == "vllm" else ()), f"trainer.steps={steps}",
            "trainer.val_every=0", *mode]


def read_metrics(run_dir: str) -> list[dict]:
    path = os.path.join(run_dir, "metrics.jsonl")
    if not os.path.isfile(path):
        return []
    with open(path) as fh:
        return [json.loads(line) for line in fh if line.strip()]


def summarize(metrics: list[dict], warmup: int) -> dict:
    steps = [m for m in metrics if "perf/time_per_step" in m and m.get("step", 0) > 0]
    steady = steps[warmup:] or steps
    if not steady:
        return {"steps_done": 0}

    def med(key):
        values = [m[key] for m in steady if key in m]
        return median(values) if values else None

    staleness = Counter()
    for m in steady:  # per step: its mean and max; the histogram of the step maxima
        if "async/staleness/max" in m:
            staleness[int(m["async/staleness/max"])] += 1
    step_s = med("perf/time_per_step")
    return {"steps_done": len(steps), "step_s": step_s, "steps_per_s": 1 / step_s,
            "busy_main": med("perf/busy/main"), "busy_gen": med("perf/busy/gen"),
            "generate_s": med("timing_s/rollout.generate"),
            "update_s": med("timing_s/actor.update"),
            "staleness_mean": med("async/staleness/mean"),
            "staleness_max_histogram": dict(sorted(staleness.items())),
            "mixed_version_rows": sum(m.get("async/mixed_version_rows", 0) for m in steady),
            "score_mean": med("critic/score/mean")}


def run_variant(args, name: str, rep: int, train: str, test: str, runs_dir: str) -> dict:
    run_name = f"{name}-{rep}-{time.strftime('%H%M%S')}"
    cmd = shipped_run(args.model, train, test, runs_dir, run_name, args.threads,
                      *variant_overrides(name, args.staleness, args.engine, args.steps),
                      *args.overrides)
    start = time.perf_counter()
    proc = subprocess.run(cmd, env=run_env(), capture_output=True, text=True)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout)[-3000:]
        raise SystemExit(f"{name} (rep {rep}) failed, exit {proc.returncode}:\n{tail}")
    return {**summarize(read_metrics(os.path.join(runs_dir, run_name)), args.warmup),
            "wall_s": wall, "command": " ".join(cmd[1:])}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=os.environ.get("HYBRIDFLOW_SMOLLM2_DIR"))
    parser.add_argument("--data", default=None, help="a word_arith folder (made if absent)")
    parser.add_argument("--engine", choices=("vllm", "hf"), default="vllm")
    parser.add_argument("--staleness", type=int, default=2)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--reps", type=int, default=1)
    parser.add_argument("--threads", type=int, default=1, help="torch threads a worker")
    parser.add_argument("--out", default=None)
    parser.add_argument("overrides", nargs="*", help="key=value for every run")
    args = parser.parse_args(argv)
    need_real_model(parser, args.model, args.data)
    if args.staleness < 1 or args.steps <= args.warmup:
        parser.error("--staleness >= 1 and --steps > --warmup")
    start_machine, results = machine(), []
    with tempfile.TemporaryDirectory(prefix="hf-stream-") as tmp:
        train, test = (os.path.join(args.data, f) for f in ("train.jsonl", "test.jsonl")) \
            if args.data else make_data(tmp, 1, 50)
        names = ["synchronous", "streaming"]
        for rep in range(args.reps):
            order = names[rep % 2:] + names[:rep % 2]
            results.append({name: run_variant(args, name, rep, train, test, tmp)
                            for name in order})
    rows = []
    for rep, res in enumerate(results):
        for name in ("synchronous", "streaming"):
            r = res[name]
            rows.append([rep, name, r.get("steps_done"), r.get("step_s"), r.get("busy_main"),
                         r.get("busy_gen"), r.get("generate_s"), r.get("update_s"),
                         r.get("staleness_mean"), r.get("staleness_max_histogram")])
    print(table(["rep", "variant", "steps", "s/step", "train busy", "rollout busy",
                 "generate s", "update s", "staleness", "max staleness (steps)"], rows))
    speed = [r["streaming"]["steps_per_s"] / r["synchronous"]["steps_per_s"] for r in results]
    print(f"streaming k={args.staleness} / synchronous steps/s: median {median(speed):.2f}x "
          f"({', '.join(f'{s:.2f}' for s in speed)})")
    path = write_results("real_model_stream", {
        "machine": start_machine, "engine": args.engine, "staleness": args.staleness,
        "steps": args.steps, "warmup": args.warmup, "threads": args.threads,
        "reps": results, "speedup": speed, "speedup_median": median(speed)}, args.out)
    print(f"-> {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
