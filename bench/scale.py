"""The engine's GRPO step on the realistic workload (bench/workload.py), side by side
with a hand-written loop and with packing + token budgets, alternated step by step.

Variants (every one on the same Qwen2 model built from a config, the same prompts
in the same order, the same generate with the same drawn lengths in its k-th step:
`bench/scale_loop.py`):

  engine-padded  `graphs/grpo.py` through the real loop (`hybridflow.run.loop.Trainer`,
                 local runtime), row micro-batches of `--micro` rows, padded;
  handwritten    the same math by hand in one process, the same micro-batches;
  engine-packed  the engine with `model.use_remove_padding=true` and token budgets
                 (`actor.max_tokens_per_micro_batch`, `rollout.log_prob_max_tokens_
                 per_micro_batch`) of `--micro` x the padded width: the same peak
                 micro-batch size, counted in real tokens.

GRPO without a KL term (`actor.use_kl_loss=false`: no reference node), one PPO
epoch, one mini-batch of every row, AdamW. Reported per variant: step time (median
of `--reps` after `--warmup`), tokens/s (generated + trained, where trained is the
real prompt + response tokens of the update), time per node, the update's padding
fraction, and peak RSS of a fresh process running one step (`--no-memory` skips it).

With `--trl` (and trl importable: `bench/scale_trl.py` says how to install it in a
venv of its own) TRL's GRPOTrainer runs at matched settings, one engine step of
each engine variant after each of its optimizer steps (alternated, not counted in
TRL's time).

    python bench/scale.py                               # 5m model, 16 prompts x 4, R 256
    python bench/scale.py --size 10m --prompts 32 --reps 3
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, ROOT)

from bench import workload  # noqa: E402 - path
from bench.engine_step import EngineStep  # noqa: E402
from bench.harness import (machine, median, peak_rss_bytes, quiet_logs,  # noqa: E402
                           set_threads, table, write_results)
from bench.scale_loop import HandwrittenScale, write_prompts  # noqa: E402
from bench.scale_trl import run_trl, trl_available  # noqa: E402

VARIANTS = ("engine-padded", "handwritten", "engine-packed")
TARGETS = {"engine_over_handwritten": 0.95, "packed_over_padded": 1.3}
TARGET_OVER_TRL = 1.5
MAX_PROMPT = 64


def settings(args) -> dict:
    return {"size": args.size, "prompts": args.prompts, "n": args.n,
            "max_response": args.max_response, "micro": args.micro, "threads": args.threads,
            "budget_tokens": args.micro * (MAX_PROMPT + args.max_response)}


def engine_overrides(s: dict, data_file: str, packed: bool) -> list[str]:
    rows = s["prompts"] * s["n"]
    out = workload.engine_overrides(s["size"], s["prompts"], s["n"], s["max_response"],
                                    MAX_PROMPT)
    out += ["actor.use_kl_loss=false", f"data.train_files={data_file}", "data.shuffle=false",
            "reward.function_path=" + os.path.join(ROOT, "bench", "scale_loop.py"),
            "rollout.backend=bench.scale_loop:length_sampled_engine",
            f"rollout.micro_batch_size={rows}", f"rollout.log_prob_micro_batch_size={s['micro']}",
            f"actor.micro_batch_size={s['micro']}", f"actor.mini_batch_size={rows}",
            "actor.lr=1e-6", "trainer.val_every=0", "trainer.progress=false",
            f"runtime.torch_threads={s['threads']}"]
    if packed:
        budget = s["budget_tokens"]
        out += ["model.use_remove_padding=true", f"actor.max_tokens_per_micro_batch={budget}",
                f"rollout.log_prob_max_tokens_per_micro_batch={budget}"]
    return out


def build(name: str, s: dict, data_file: str, texts: list[str]):
    if name == "handwritten":
        return HandwrittenScale(texts, s["size"], s["prompts"], s["n"], s["max_response"],
                                s["micro"])
    return EngineStep(engine_overrides(s, data_file, name == "engine-packed"),
                      s["prompts"] * s["n"])


def alternated(steppers: dict, reps: int, warmup: int) -> dict[str, list[dict]]:
    """Each variant's step results with `seconds`, one of each in turn (the first
    rotates every round); `warmup` rounds first, not kept."""
    names = list(steppers)
    samples: dict[str, list[dict]] = {name: [] for name in names}
    for i in range(warmup + reps):
        k = i % len(names)
        for name in names[k:] + names[:k]:
            start = time.perf_counter()
            result = steppers[name].step()
            result["seconds"] = time.perf_counter() - start
            if i >= warmup:
                samples[name].append(result)
            print(f"  step {i} {name:14s} {result['seconds']:7.2f} s", flush=True)
    return samples


def summarise(samples: dict[str, list[dict]], hand: list[dict]) -> dict:
    """Per variant: median step, tokens/s, phases; token counts from the hand-written
    loop's steps (every variant's k-th step has the same prompts and lengths)."""
    generated = median([h["generated_tokens"] for h in hand])
    trained = median([h["trained_tokens"] for h in hand])
    padded_cells = median([h["computed_cells"] for h in hand])
    out = {}
    for name, runs in samples.items():
        step_s = median([r["seconds"] for r in runs])
        phases = sorted({p for r in runs for p in r["phases_s"]})
        out[name] = {
            "step_s": step_s, "step_samples_s": [r["seconds"] for r in runs],
            "tokens_per_s": (generated + trained) / step_s,
            "phases_s": {p: median([r["phases_s"].get(p, 0.0) for r in runs]) for p in phases},
            "update_padding_fraction": 0.0 if name == "engine-packed"
            else 1 - trained / padded_cells,
        }
    out["tokens"] = {"generated": generated, "trained": trained, "padded_cells": padded_cells}
    return out


def training_seconds(variant: dict) -> float:
    """The training-side passes of a step: old log-probs and the update."""
    phases = variant["phases_s"]
    return phases.get("actor.logprob", 0.0) + phases.get("actor.update", 0.0)


def targets(summary: dict, trl: dict | None = None) -> dict:
    tps = {name: summary[name]["tokens_per_s"] for name in VARIANTS if name in summary}
    ratios = {"engine_over_handwritten": tps["engine-padded"] / tps["handwritten"],
              "packed_over_padded": tps["engine-packed"] / tps["engine-padded"],
              "packed_engine_over_handwritten": tps["engine-packed"] / tps["handwritten"],
              "packed_over_padded_training_passes":
                  training_seconds(summary["engine-padded"])
                  / training_seconds(summary["engine-packed"])}
    verdict = {f"{k}_ge_{v}": ratios[k] >= v for k, v in TARGETS.items()}
    if trl and "trl_step_s" in trl:
        for name in ("engine-padded", "engine-packed"):
            key = f"{name}_over_trl".replace("-", "_")
            ratios[key] = trl["trl_step_s"] / trl[f"{name}_step_s"]  # same tokens a step
            verdict[f"{key}_ge_{TARGET_OVER_TRL}"] = ratios[key] >= TARGET_OVER_TRL
    return {**ratios, "verdict": verdict}


# ------------------------------------------------------------------- memory
def probe(name: str, s: dict) -> dict:
    """In a fresh process: build one variant, run one step, report VmHWM."""
    set_threads(s["threads"])
    data_file, texts = _dataset(s)
    if name == "trl":
        from transformers import TrainerCallback

        from bench.scale_trl import trl_trainer
        trl_trainer(s, texts, 1, TrainerCallback()).train()
    else:
        build(name, s, data_file, texts).step()
    return {"variant": name, "peak_rss": peak_rss_bytes()}


def memory(s: dict, with_trl: bool = False) -> dict:
    out = {}
    for name in VARIANTS + (("trl",) if with_trl else ()):
        proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--probe", name,
                               "--settings", json.dumps(s)], capture_output=True, text=True,
                              timeout=900, cwd=ROOT)
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
        out[name] = json.loads(lines[-1]) if lines else {"error": proc.stderr[-2000:]}
    return out


def _dataset(s: dict) -> tuple[str, list[str]]:
    path = os.path.join(tempfile.mkdtemp(prefix="bench-scale-data-"), "prompts.jsonl")
    return path, write_prompts(path, max(256, 4 * s["prompts"]))


# ---------------------------------------------------------------------- run
def run(s: dict, reps: int = 2, warmup: int = 1, with_memory: bool = True,
        out: str | None = None, quiet: bool = False, with_trl: bool = False) -> dict:
    quiet_logs()
    set_threads(s["threads"])
    data_file, texts = _dataset(s)
    payload: dict = {"machine": machine(), "settings": s, "reps": reps, "warmup": warmup}
    steppers = {name: build(name, s, data_file, texts) for name in VARIANTS}
    samples = alternated(steppers, reps, warmup)
    trl = None
    if with_trl and trl_available():
        engines = {name: steppers[name] for name in ("engine-padded", "engine-packed")}
        runs = run_trl(s, texts, engines, reps, warmup)
        trl = {key: median(values) for key, values in runs.items()}
        payload["trl"] = {**trl, "samples": runs}
    elif with_trl:
        payload["trl"] = {"skipped": "trl is not importable here (see bench/scale_trl.py)"}
    for name in ("engine-padded", "engine-packed"):
        steppers[name].close()
    summary = summarise(samples, samples["handwritten"])
    payload["variants"] = {k: v for k, v in summary.items() if k in VARIANTS}
    payload["tokens"] = summary["tokens"]
    payload["targets"] = targets(summary, trl)
    if with_memory:
        payload["memory"] = memory(s, with_trl and trl_available())
        if "trl" in payload["memory"] and "trl_step_s" in payload.get("trl", {}):
            payload["trl"]["peak_rss_mib"] = payload["memory"]["trl"].get("peak_rss", 0) / 2**20
        for name, probe_out in payload["memory"].items():
            if name not in payload["variants"]:
                continue
            payload["variants"][name]["peak_rss_mib"] = probe_out.get("peak_rss", 0) / 2**20 \
                if "peak_rss" in probe_out else None
    path = write_results("scale", payload, out)
    if not quiet:
        print(report(payload))
        print(f"\nwrote {path}")
    return payload


def report(p: dict) -> str:
    m, s = p["machine"], p["settings"]
    lines = [f"machine: {m['cpu']}, {m['cores']} cores, torch {m['torch']}, torch threads "
             f"{m['torch_threads']}, load {m['load_avg_1m_at_start']}",
             f"workload: {s['size']} Qwen2, {s['prompts']} prompts x {s['n']}, responses <= "
             f"{s['max_response']} (long tail), micro-batch {s['micro']} rows / "
             f"{s['budget_tokens']} tokens; median of {p['reps']} alternated steps",
             f"tokens a step: generated {p['tokens']['generated']:.0f}, trained "
             f"{p['tokens']['trained']:.0f} (padded cells {p['tokens']['padded_cells']:.0f})"]
    phases = sorted({ph for v in p["variants"].values() for ph in v["phases_s"]})
    rows = [[name, v["step_s"], v["tokens_per_s"], v["update_padding_fraction"],
             v.get("peak_rss_mib")] + [v["phases_s"].get(ph) for ph in phases]
            for name, v in p["variants"].items()]
    lines.append(table(["variant", "step s", "tokens/s", "padding", "peak RSS MiB"]
                       + [f"{ph} s" for ph in phases], rows))
    trl = p.get("trl", {})
    if "trl_step_s" in trl:
        lines.append(f"TRL GRPOTrainer (its own run, alternated with the engine): step "
                     f"{trl['trl_step_s']:.2f} s; engine-padded {trl['engine-padded_step_s']:.2f}"
                     f" s, engine-packed {trl['engine-packed_step_s']:.2f} s; TRL peak RSS "
                     f"{trl.get('peak_rss_mib', float('nan')):.0f} MiB")
    elif "skipped" in trl:
        lines.append(f"TRL: {trl['skipped']}")
    lines.append("ratios (tokens/s; TRL: step time, same tokens) and targets:")
    lines += [f"  {k}: {v}" for k, v in p["targets"].items()]
    return "\n".join(lines)




def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="5m", choices=sorted(workload.SIZES))
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--max-response", type=int, default=256)
    parser.add_argument("--micro", type=int, default=8, help="rows per padded micro-batch")
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--no-memory", action="store_true")
    parser.add_argument("--trl", action="store_true", help="also TRL's GRPOTrainer")
    parser.add_argument("--out", default=None)
    parser.add_argument("--probe", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--settings", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.probe:
        quiet_logs()
        print(json.dumps(probe(args.probe, json.loads(args.settings))))
        return
    run(settings(args), args.reps, args.warmup, not args.no_memory, args.out,
        with_trl=args.trl)


if __name__ == "__main__":
    main()
