"""One GRPO step on the real model (SmolLM2-135M-Instruct) from the shipped config,
under variants of it, alternated: which engine choice to ship, measured end to end.

    python bench/real_model_step.py --model $HYBRIDFLOW_SMOLLM2_DIR            # padded vs packed
    python bench/real_model_step.py --model DIR --variant bf16=model.dtype=bfloat16

Each variant is a set of overrides of `graphs/configs/smollm2_arith.yaml`; the first
(`padded`, the shipped config as it is) is the baseline. A round runs every variant
once, as its own `hybridflow run` process (`--steps` steps, no validation, no
checkpoint), the first variant rotating each round so none always runs after the
same one. Per node (`timing_s/<node>` of metrics.jsonl, every step) the median over
rounds and steps, and its ratio to the baseline's; the packed variant changes only
`actor.logprob` and `actor.update` (generation does not pack). Prints a table,
writes bench/results/real_model_step.json.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from collections import defaultdict

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.harness import machine, median, need_real_model, table, write_results
from bench.real_model_curve import run_env, shipped_run

DEFAULT_VARIANTS = ["padded=", "packed=model.use_remove_padding=true"]
NODES = ("rollout.generate", "actor.logprob", "actor.update")


def parse_variant(text: str) -> tuple[str, list[str]]:
    """'name=key=value,key=value' -> (name, overrides); 'name=' is the config as is."""
    name, sep, rest = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(
            f"--variant {text!r}: write NAME=key=value[,key=value...] (NAME= for none)")
    return name, [o for o in rest.split(",") if o]


def run_once(args, overrides: list[str], runs_dir: str, tag: str) -> list[dict]:
    cmd = shipped_run(args.model, f"{args.data}/train.jsonl", f"{args.data}/test.jsonl",
                      runs_dir, tag, args.threads, f"trainer.steps={args.steps}",
                      "trainer.val_every=0", "trainer.save_every=0", *overrides)
    done = subprocess.run(cmd, env=run_env(), capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"variant {tag} failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    with open(os.path.join(runs_dir, tag, "metrics.jsonl")) as fh:
        return [m for m in map(json.loads, fh) if m.get("step", 0) > 0]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=os.environ.get("HYBRIDFLOW_SMOLLM2_DIR"))
    parser.add_argument("--data", default="/tmp/hybridflow-curve-data",
                        help="a word_arith folder (train.jsonl, test.jsonl)")
    parser.add_argument("--variant", action="append", type=parse_variant, default=None)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    need_real_model(parser, args.model, args.data, data_needed=True)
    variants = dict(args.variant or [parse_variant(v) for v in DEFAULT_VARIANTS])
    start = machine()
    seconds: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    names = list(variants)
    with tempfile.TemporaryDirectory(prefix="hf-step-") as runs_dir:
        for r in range(args.rounds):
            order = names[r % len(names):] + names[:r % len(names)]
            for name in order:
                for m in run_once(args, variants[name], runs_dir, f"{name}-{r}"):
                    for node in (*NODES, "step"):
                        key = "perf/time_per_step" if node == "step" else f"timing_s/{node}"
                        if key in m:
                            seconds[name][node].append(m[key])
                print(f"round {r} {name}: done", flush=True)
    base = names[0]
    rows = []
    for name in names:
        for node in (*NODES, "step"):
            got, ref = seconds[name][node], seconds[base][node]
            if got and ref:
                rows.append([name, node, median(got), median(ref) / median(got)])
    print(table(["variant", "node", "median s", f"speed-up vs {base}"], rows))
    path = write_results("real_model_step", {
        "machine": start, "load_avg_1m_at_end": os.getloadavg()[0], "args": {
            k: v for k, v in vars(args).items() if k != "variant"},
        "variants": variants, "seconds": {k: dict(v) for k, v in seconds.items()},
        "rows": [dict(zip(("variant", "node", "median_s", "speedup"), r)) for r in rows]},
        args.out)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
