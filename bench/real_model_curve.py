"""GRPO learning curve on a real pretrained model (SmolLM2-135M-Instruct) and the
word_arith task, from the shipped config, for a wall-clock budget.

    python bench/real_model_curve.py --model $HYBRIDFLOW_SMOLLM2_DIR --minutes 25

Runs `hybridflow run graphs/grpo.py --config graphs/configs/smollm2_arith.yaml` (HF
engine, local runtime) with every held-out prompt's greedy response logged
(`trainer.log_val_generations`), sends SIGTERM at the deadline (the run finishes its
step and stops), then reads the run directory: held-out greedy accuracy at each
validation by the GSM8K scorer's flexible extraction (the reward) and its strict one
(the "#### N" format), the base model's first (step 0). `--report RUN_DIR` reads a
run made earlier. Prints a table, writes bench/results/real_model_curve.json.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from collections import defaultdict

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.harness import machine, need_real_model, table, write_results

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = os.path.join(ROOT, "graphs", "configs", "smollm2_arith.yaml")


def make_data(out: str, seed: int, n_test: int) -> tuple[str, str]:
    from hybridflow.core.data import word_arith_rows, write_rows
    train, test = word_arith_rows(seed, 2000, n_test, 20)
    paths = os.path.join(out, "train.jsonl"), os.path.join(out, "test.jsonl")
    for rows, path in zip((train, test), paths):
        write_rows(rows, path)
    return paths


def shipped_run(model: str, train: str, test: str, runs_dir: str, run_name: str,
                threads: int, *overrides: str) -> list[str]:
    """The `hybridflow run` command of the shipped config on these files (this
    interpreter, no progress bar); `overrides` come last and win."""
    return [sys.executable, "-m", "hybridflow", "run", os.path.join(ROOT, "graphs", "grpo.py"),
            "--config", CONFIG, f"model.path={model}", f"data.train_files={train}",
            f"data.val_files={test}", f"trainer.runs_dir={runs_dir}",
            f"trainer.run_name={run_name}", f"runtime.torch_threads={threads}",
            "trainer.progress=false", *overrides]


def run_env() -> dict:
    """This checkout first on the run's PYTHONPATH (a bench runs from the repository)."""
    return {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}


def launch(args, train: str, test: str) -> str:
    run_name = f"curve-{time.strftime('%Y%m%d-%H%M%S')}"
    cmd = shipped_run(args.model, train, test, args.runs_dir, run_name, args.threads,
                      f"trainer.log_val_generations={args.n_test}",
                      f"trainer.steps={args.max_steps}", *args.overrides)
    print(" ".join(cmd), flush=True)
    proc = subprocess.Popen(cmd, env=run_env())
    deadline = time.monotonic() + args.minutes * 60
    while proc.poll() is None and time.monotonic() < deadline:
        time.sleep(5)
    if proc.poll() is None:  # the run's signal guard lets the step finish, then stops
        proc.send_signal(signal.SIGTERM)
        proc.wait()
    return os.path.join(args.runs_dir, run_name)


def _read(path: str) -> list[dict]:
    if not os.path.isfile(path):
        return []
    with open(path) as fh:
        return [json.loads(line) for line in fh if line.strip()]


def report(run_dir: str) -> dict:
    """Per validation: step, wall seconds since the start, accuracy (flexible, strict)."""
    from hybridflow.algorithms.rewards.gsm8k import compute_score
    metrics = _read(os.path.join(run_dir, "metrics.jsonl"))
    by_step = defaultdict(list)
    for s in _read(os.path.join(run_dir, "generations.jsonl")):
        if s["split"] == "val":
            by_step[s["step"]].append(s)
    elapsed, wall = 0.0, {0: 0.0}
    for m in metrics:
        elapsed += m.get("perf/time_per_step", 0.0)
        wall[m["step"]] = elapsed
    points = []
    for step in sorted(by_step):
        rows = by_step[step]
        score = {method: sum(compute_score(r["data_source"], r["response"], r["ground_truth"],
                                           method=method) for r in rows) / len(rows)
                 for method in ("flexible", "strict")}
        points.append({"step": step, "train_s": round(wall.get(step, float("nan")), 1),
                       "n": len(rows), "flexible": score["flexible"], "strict": score["strict"],
                       "mean_response_chars": sum(len(r["response"]) for r in rows) / len(rows)})
    steps = [m for m in metrics if m.get("step", 0) > 0 and "perf/time_per_step" in m]
    return {"run_dir": run_dir, "points": points, "steps_done": len(steps),
            "s_per_step": (sum(m["perf/time_per_step"] for m in steps) / len(steps))
            if steps else None,
            "train_score_by_step": [m.get("critic/score/mean") for m in steps]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=os.environ.get("HYBRIDFLOW_SMOLLM2_DIR"))
    parser.add_argument("--data", default="/tmp/hybridflow-curve-data")
    parser.add_argument("--runs-dir", default="/tmp/hybridflow-curve-runs")
    parser.add_argument("--minutes", type=float, default=25.0)
    parser.add_argument("--max-steps", type=int, default=200)
    parser.add_argument("--n-test", type=int, default=100)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--report", metavar="RUN_DIR", help="read a run made earlier")
    parser.add_argument("--out", default=None, help="results JSON (default bench/results/)")
    parser.add_argument("overrides", nargs="*", help="key=value for the run")
    args = parser.parse_args()
    start_machine = machine()
    if args.report:
        run_dir = args.report
    else:
        need_real_model(parser, args.model)
        train, test = make_data(args.data, 1, args.n_test)
        run_dir = launch(args, train, test)
    result = report(run_dir)
    base = result["points"][0] if result["points"] else None
    print(table(["step", "train s", "n", "flexible acc", "strict acc", "resp chars"],
                [[p["step"], p["train_s"], p["n"], p["flexible"], p["strict"],
                  p["mean_response_chars"]] for p in result["points"]]))
    if base:
        best = max(p["flexible"] for p in result["points"])
        print(f"base {base['flexible']:.3f} -> best {best:.3f} "
              f"({100 * (best - base['flexible']):+.1f} points), "
              f"{result['steps_done']} steps at {result['s_per_step'] or 0:.1f} s/step")
    path = write_results("real_model_curve", {"machine": start_machine,
                                              "load_avg_1m_at_end": os.getloadavg()[0],
                                              "args": vars(args), **result}, args.out)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
