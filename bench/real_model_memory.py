"""`hybridflow check --memory` against the measured peak of each actor pass
(`rollout.generate` on the actor's HF engine, `actor.logprob`, `actor.update`) on a
real pretrained model (SmolLM2-135M-Instruct) with the shipped config
(graphs/configs/smollm2_arith.yaml) and with larger micro-batches.

    python bench/real_model_memory.py --model $HYBRIDFLOW_SMOLLM2_DIR --data data/word_arith
    # development: --configs tiny

Prediction: `hybridflow.memory.report.plan_memory` on the compiled plan, the very
numbers `check --memory` prints: the actor's resident bytes (weights, AdamW moments)
plus the pass's transient parts. It assumes every row padded to
`data.max_prompt_length + rollout.max_new_tokens`, so the measured passes run at
that width: the data file's prompts left-padded to `data.max_prompt_length`, the
responses (always `max_new_tokens` wide in the batch) from a real `generate`.

Measurement, per configuration in a fresh process, in the steady state (one
generate, log-prob and update first, so AdamW's moments exist as they do from the
second step on):
- **tensor peak** (the figure compared): the bytes of every live CPU tensor before
  the pass plus the highest running sum of the CPU allocator's events during it
  (torch's profiler, `profile_memory=True`: bench/memory.py's method). This counts
  what the prediction models, tensor storage, and nothing it does not (Python
  objects, libraries, the allocator's cached or fragmented pages), so it is the
  comparable figure.
- **RSS growth** (for reference): the pass run again without the profiler, the peak
  RSS (VmHWM, reset before the pass through /proc/self/clear_refs) minus the RSS
  before it, against the pass's predicted transient bytes. It is what the OS sees;
  glibc keeps freed small blocks, so it can read under the tensors' growth, and
  libraries' buffers (oneDNN, OpenMP) add to it.

`generate` stops when every row has ended, so its width is what the model wrote:
the table gives the widest response, and the prediction is also evaluated at that
width (`predicted at width`). Prints a table; writes bench/results/real_model_memory.json.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, ROOT)

from bench.engine_step import GRPO  # noqa: E402
from bench.harness import (machine, need_real_model, peak_rss_bytes, reset_peak_rss,  # noqa: E402
                           rss_bytes, set_threads, table, write_results)

CONFIG = os.path.join(ROOT, "graphs", "configs", "smollm2_arith.yaml")
MIB = 2 ** 20
TARGET = 0.15
PASSES = ("rollout.generate", "actor.logprob", "actor.update")
# name -> overrides on the shipped config
CONFIGS = {
    "shipped": [],
    "micro16": ["actor.micro_batch_size=16", "rollout.log_prob_micro_batch_size=32"],
    # half the rows (4 prompts x 4), the same log-prob and update micro-batches: the
    # same peaks of those passes for half the compute (a loaded machine)
    "shipped-b4": ["data.batch_size=4"],
    "micro16-b4": ["data.batch_size=4", "actor.micro_batch_size=16"],
    "tiny": ["data.batch_size=2", "rollout.n=2", "rollout.max_new_tokens=8",
             "actor.mini_batch_size=4", "actor.micro_batch_size=2",
             "rollout.log_prob_micro_batch_size=4", "rollout.micro_batch_size=4"],
}

__all__ = ["CONFIGS", "overrides", "predict", "probe", "run", "report"]


def overrides(name: str, model: str, data: str, threads: int) -> list[str]:
    return [f"model.path={model}", f"data.train_files={data}/train.jsonl",
            f"data.val_files={data}/test.jsonl", f"runtime.torch_threads={threads}",
            *CONFIGS[name]]


def predict(loaded, response: int | None = None) -> dict[str, dict]:
    """Per pass: the actor's resident bytes and the pass's transient parts, as
    `check --memory` reports them (with `response`: at that response width)."""
    from hybridflow.memory.report import plan_memory
    cfg = loaded.cfg
    if response is not None:
        from omegaconf import OmegaConf
        cfg = OmegaConf.merge(cfg, {"rollout": {"max_new_tokens": response}})
    mem = plan_memory(cfg, loaded.plan)
    roles = {r.role: r for r in mem.roles}
    resident = roles["actor"].resident
    out = {}
    for name in PASSES:
        role = roles[name.split(".")[0]]
        parts = role.passes[name]
        out[name] = {"resident": dict(resident), "transient": dict(parts),
                     "peak": sum(resident.values()) + sum(parts.values())}
    return out


def _prompts(loaded, tokenizer):
    from hybridflow.core.data import PromptDataset, tokenize_prompts
    cfg = loaded.cfg
    width = int(cfg.data.max_prompt_length)
    data = PromptDataset.from_file(cfg.data.train_files, tokenizer, width)
    rows = data.rows[: int(cfg.data.batch_size)]
    return tokenize_prompts(rows, tokenizer.pad_token_id, [f"u{i}" for i in range(len(rows))],
                            width)


def _with_advantages(batch):
    import torch

    from hybridflow.core.batch import Batch
    mask = batch["response_mask"].float()
    gen = torch.Generator().manual_seed(0)
    return batch.update(Batch({"advantages": torch.randn(mask.shape, generator=gen) * mask}))


def probe(name: str, model: str, data: str, threads: int, with_rss: bool = True,
          warmup: bool = True) -> dict:
    """In this (fresh) process: predicted and measured peak of each pass of `name`.
    Without `warmup` the passes run once, in step order: AdamW's moments do not exist
    yet in generate and log-prob, so their prediction leaves them out (the update
    allocates them after its first mini-batch, before its peak)."""
    from bench.memory import cpu_peak_of, live_tensor_bytes
    from hybridflow.program.assemble import prepare
    from hybridflow.workers.actor import ActorWorker
    set_threads(threads)
    loaded = prepare(GRPO, overrides(name, model, data, threads), yaml_file=CONFIG)
    worker = ActorWorker(loaded.values)
    prompts = _prompts(loaded, worker.tokenizer)
    n = int(loaded.cfg.rollout.n)
    state = {}

    def generate():
        state["gen"] = worker.generate(prompts, n=n)

    def logprob():
        state["old"] = worker.logprob(state["gen"])

    def update():
        worker.update(_with_advantages(state["gen"].update(state["old"])))

    calls = {"rollout.generate": generate, "actor.logprob": logprob, "actor.update": update}
    for call in calls.values() if warmup else ():  # AdamW's moments, lazy buffers
        call()
    measured = {}
    for pass_name, call in calls.items():
        if pass_name == "rollout.generate":
            state.clear()
        gc.collect()
        before = live_tensor_bytes()
        peak = before + cpu_peak_of(call)
        row = {"live_before": before, "tensor_peak": peak}
        if with_rss:
            if pass_name == "rollout.generate":
                state.clear()
            gc.collect()
            rss0, row["rss_growth"] = rss_bytes(), None
            if reset_peak_rss():
                call()
                row["rss_growth"] = peak_rss_bytes() - rss0
        measured[pass_name] = row
        print(f"{name} {pass_name}: tensor peak {peak / MIB:.1f} MiB", file=sys.stderr,
              flush=True)  # a probe stopped part-way still shows what it measured
    widest = int(state["gen"]["response_mask"].sum(1).max())
    predicted, at_width = predict(loaded), predict(loaded, max(1, widest))

    shapes = {"rows": len(state["gen"]), "prompt_width": int(prompts["input_ids"].shape[1]),
              "max_new_tokens": int(loaded.cfg.rollout.max_new_tokens),
              "widest_response": widest,
              "actor_micro": int(loaded.cfg.actor.micro_batch_size),
              "logprob_micro": int(loaded.cfg.rollout.log_prob_micro_batch_size),
              "generate_micro": int(loaded.cfg.rollout.micro_batch_size)}
    if not warmup:
        for p in ("rollout.generate", "actor.logprob"):
            for pred in (predicted[p], at_width[p]):
                pred["peak"] -= pred["resident"].pop("optimizer", 0)
    return {"config": name, "overrides": CONFIGS[name], "shapes": shapes, "warmup": warmup,
            "passes": {p: {**measured[p], "predicted": predicted[p],
                           "predicted_at_width": at_width[p]["peak"],
                           "error": predicted[p]["peak"] / measured[p]["tensor_peak"] - 1}
                       for p in PASSES}}


def run(names: list[str], model: str, data: str, threads: int, with_rss: bool = True,
        out: str | None = None, quiet: bool = False, warmup: bool = True) -> dict:
    """Each configuration in a fresh process; the JSON is rewritten after each one, so
    a run stopped part-way keeps the configurations it finished."""
    results, payload, path = [], {}, None
    for name in names:
        cmd = [sys.executable, os.path.abspath(__file__), "--probe", name, "--model", model,
               "--data", data, "--threads", str(threads)] + ([] if with_rss else ["--no-rss"]) \
            + ([] if warmup else ["--no-warmup"])
        # the probe's stderr (each pass as it is measured, any traceback) passes through
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, cwd=ROOT,
                              env={**os.environ, "PYTHONPATH": ROOT})
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
        if proc.returncode or not lines:
            raise SystemExit(f"probe {name} failed (exit {proc.returncode}): its output "
                             "is above")
        results.append(json.loads(lines[-1]))
        if not quiet:
            print(report_config(results[-1]), flush=True)
        payload = summarize(results)
        path = write_results("real_model_memory", payload, out)
    if not quiet:
        print(f"{payload['within_target']}/{payload['passes']} passes within "
              f"±{TARGET:.0%}; worst {payload['worst_abs_error']:.1%}\nwrote {path}")
    return payload


def summarize(results: list[dict]) -> dict:
    errors = [abs(p["error"]) for r in results for p in r["passes"].values()]
    return {"machine": machine(), "method": "tensor peak: live CPU tensors before + "
            "profiler allocation events (bench/memory.py); rss: VmHWM growth",
            "target": TARGET, "configs": results, "worst_abs_error": max(errors),
            "within_target": sum(e <= TARGET for e in errors), "passes": len(errors),
            "load_avg_1m_at_end": os.getloadavg()[0]}


def report_config(r: dict) -> str:
    s = r["shapes"]
    head = (f"{r['config']}: {s['rows']} rows, prompts {s['prompt_width']} + responses "
            f"{s['max_new_tokens']} (widest generated {s['widest_response']}), micro-batches: "
            f"generate {s['generate_micro']}, log-prob {s['logprob_micro']}, update "
            f"{s['actor_micro']}")
    rows = []
    for name, p in r["passes"].items():
        transient = sum(p["predicted"]["transient"].values())
        growth = p.get("rss_growth")
        rows.append([name, p["predicted"]["peak"] / MIB, p["predicted_at_width"] / MIB,
                     p["tensor_peak"] / MIB, p["predicted"]["peak"] / p["tensor_peak"],
                     transient / MIB, None if growth is None else growth / MIB])
    return head + "\n" + table(["pass", "predicted MiB", "predicted at width MiB",
                                "measured MiB", "predicted / measured",
                                "predicted transient MiB", "RSS growth MiB"], rows)


def report(payload: dict) -> str:
    return "\n".join(report_config(r) for r in payload["configs"])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=os.environ.get("HYBRIDFLOW_SMOLLM2_DIR"))
    parser.add_argument("--data", default=None, help="a folder with train.jsonl, test.jsonl")
    parser.add_argument("--configs", nargs="*", default=["shipped", "micro16"],
                        choices=sorted(CONFIGS))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--no-rss", action="store_true", help="skip the RSS runs")
    parser.add_argument("--no-warmup", action="store_true",
                        help="each pass once, in step order (a third of the time; AdamW's "
                        "moments are left out of generate's and log-prob's prediction)")
    parser.add_argument("--out", default=None)
    parser.add_argument("--probe", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    need_real_model(parser, args.model, args.data, data_needed=True)
    if args.probe:
        import warnings
        warnings.filterwarnings("ignore")
        print(json.dumps(probe(args.probe, args.model, args.data, args.threads,
                               not args.no_rss, not args.no_warmup)))
        return 0
    run(args.configs, args.model, args.data, args.threads, not args.no_rss, args.out,
        warmup=not args.no_warmup)
    return 0


if __name__ == "__main__":
    sys.exit(main())
