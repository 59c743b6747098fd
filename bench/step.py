"""One GRPO step of the embedded default (graphs/grpo.py: tiny Llama from
graphs/assets/toy_base, 16 prompts x 8 samples, 4 new tokens) four ways:

  (a) local runtime, through the real loop (`hybridflow.run.loop.Trainer.train_step`);
  (b) Ray runtime, every role colocated on one logical GPU (one worker process);
  (c) hand-written single-process torch loop doing the same math (handwritten_grpo.py);
  (d) TRL's GRPOTrainer with the same model and settings, when trl is installed.

Phases: (1) step time of a, b, c alternated step by step (a, b, c, b, c, a, ...),
median of `--steps` after `--warmup`; (2) TRL: its own loop, with one local-runtime
step run between TRL steps (so d and a alternate too; d's time excludes it);
(3) time to 0.9 held-out greedy accuracy from the shipped base model for a and c,
trained in lockstep, validated every `--val-every` steps (validation not counted),
capped; (4) peak memory: each variant in a fresh process (VmHWM; Ray: driver + worker).

    python bench/step.py [--steps 20] [--threads 1] [--no-ray] [--no-trl] [--no-accuracy]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import types

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, ROOT)

from bench.harness import (alternate, machine, median, peak_rss_bytes,  # noqa: E402 - path
                           quiet_logs, set_threads, table, write_results)

GRPO = os.path.join(ROOT, "graphs", "grpo.py")
VAL_KEY = "val/toy_arith/greedy"
TARGET_VS_HANDWRITTEN = 1.1
TARGET_VS_TRL = 1.5




# Every variant does the same math: GRPO without a KL term (TRL's default beta=0), so
# the engine's graph has no reference node and the hand-written loop no reference model.
SAME_MATH = ["actor.use_kl_loss=false"]


# ----------------------------------------------------------------- variants
def local_trainer(threads: int, overrides=()):
    from hybridflow.program.assemble import prepare
    from hybridflow.run.loop import Trainer
    from hybridflow.run.tracking import RunDir
    loaded = prepare(GRPO, [*SAME_MATH, "trainer.val_samples=1", "trainer.progress=false",
                            f"runtime.torch_threads={threads}", *overrides])
    return Trainer(loaded, RunDir(tempfile.mkdtemp(prefix="bench-step-")))


class RayStep:
    """What Trainer.train_step does, on a Ray runtime (no validation roles)."""

    def __init__(self, threads: int):
        import ray

        from hybridflow.program.assemble import prepare
        from hybridflow.run.loop import Trainer
        from hybridflow.runtime.ray.executor import RayRuntime
        if not ray.is_initialized():
            from hybridflow.runtime.ray.session import workers_at_driver_priority
            with workers_at_driver_priority():  # as a run's own Ray: workers at nice 0
                ray.init(num_cpus=8, num_gpus=4, include_dashboard=False,
                         log_to_driver=False)
        loaded = prepare(GRPO, [*SAME_MATH, "runtime.name=ray", "trainer.val_every=0",
                                f"runtime.torch_threads={threads}"])
        self.cfg = loaded.cfg
        self.loader, _ = Trainer._make_loaders(types.SimpleNamespace(cfg=loaded.cfg,
                                                                     plan=loaded.plan))
        self.runtime = RayRuntime(loaded.plan, loaded.cfg, seed=loaded.cfg.trainer.seed)

    def step(self) -> dict:
        feeds = {"prompts": self.loader.next_batch()}
        result = self.runtime.run_step(feeds, draw=lambda _: self.loader.next_batch())
        return {"driver_bytes": result.driver_bytes}

    def worker_pids(self) -> list[int]:
        return [info["pid"] for info in self.runtime.worker_info("main")]

    def close(self) -> None:
        self.runtime.shutdown()


def handwritten():
    from bench.handwritten_grpo import HandwrittenGRPO
    return HandwrittenGRPO()


# ---------------------------------------------------------------------- TRL
def trl_available() -> bool:
    try:
        import trl  # noqa: F401
        return True
    except ImportError:
        return False


def trl_trainer(steps: int, callback):
    """GRPOTrainer with the embedded default's settings: 16 prompts x 8 samples a
    generation (64 completions per optimizer step, 2 steps per generation, like the
    actor's mini-batch of 64), 4 new tokens, AdamW 2e-4, clip 0.2, token-mean
    ('dapo') loss, std-scaled group advantages, no KL (beta 0, as actor.use_kl_loss
    is off), grad clip 1.0, CPU, fp32."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    from hybridflow.algorithms.rewards import compute_score
    from hybridflow.graphs.common import TOY_BASE
    from hybridflow.core.data import toy_rows
    train, _ = toy_rows(1, 9, 0.25)
    data = Dataset.from_list([{"prompt": r["prompt"], "data_source": r["data_source"],
                               "ground_truth": r["reward_model"]["ground_truth"]}
                              for r in train])

    def reward(prompts, completions, data_source, ground_truth, **_):
        return [float(compute_score(ds, c, gt))
                for c, ds, gt in zip(completions, data_source, ground_truth)]

    tok = AutoTokenizer.from_pretrained(TOY_BASE)
    tok.padding_side = "left"
    args = GRPOConfig(
        output_dir=tempfile.mkdtemp(prefix="bench-trl-"), use_cpu=True, report_to="none",
        per_device_train_batch_size=64, steps_per_generation=2, gradient_accumulation_steps=1,
        num_generations=8, max_completion_length=4, temperature=1.0, top_p=1.0, top_k=0,
        learning_rate=2e-4, weight_decay=0.01, adam_beta1=0.9, adam_beta2=0.999,
        max_grad_norm=1.0, lr_scheduler_type="constant", warmup_steps=0, beta=0.0,
        epsilon=0.2, num_iterations=1, loss_type="dapo", scale_rewards="group",
        max_steps=steps, save_strategy="no", logging_steps=10_000, seed=1,
        remove_unused_columns=False, dataloader_num_workers=0, bf16=False,
        disable_tqdm=True, log_completions=False)
    model = AutoModelForCausalLM.from_pretrained(TOY_BASE)
    return GRPOTrainer(model=model, reward_funcs=reward, args=args, train_dataset=data,
                       processing_class=tok, callbacks=[callback])


# TRL generates a whole generation batch in one call and computes old log-probs in
# chunks of the per-device batch (64); the embedded default now does the same.
TRL_MATCHED = ["rollout.micro_batch_size=128", "rollout.log_prob_micro_batch_size=64"]


def run_trl(locals_: dict, steps: int, warmup: int) -> dict:
    """TRL for (warmup + steps) generations of 128 completions (2 optimizer steps
    each); after every generation's second optimizer step, one step of each local
    runtime in `locals_` (not counted in TRL's time)."""
    from transformers import TrainerCallback

    class Alternate(TrainerCallback):
        def __init__(self):
            self.mark, self.trl_steps = None, []
            self.local_steps = {name: [] for name in locals_}

        def on_train_begin(self, args, state, control, **kw):
            self.mark = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            self.trl_steps.append(time.perf_counter() - self.mark)
            if state.global_step % 2 == 0:  # one generation done: run the local steps
                for name, local in locals_.items():
                    start = time.perf_counter()
                    local.train_step()
                    self.local_steps[name].append(time.perf_counter() - start)
            self.mark = time.perf_counter()

    cb = Alternate()
    trainer = trl_trainer(2 * (warmup + steps), cb)
    trainer.train()
    pairs = [a + b for a, b in zip(cb.trl_steps[0::2], cb.trl_steps[1::2])][warmup:]
    return {"trl_step_s": pairs,
            **{f"{name}_step_s": ts[warmup:] for name, ts in cb.local_steps.items()}}


# ----------------------------------------------------------------- accuracy
def time_to_accuracy(threads: int, target: float, val_every: int, max_steps: int,
                     cap_s: float) -> dict:
    """a and c from the base model in lockstep; training seconds until greedy
    held-out accuracy >= target (validation time not counted)."""
    local = local_trainer(threads)
    hand = handwritten()
    runs = {"local": {"train_s": 0.0, "steps": 0, "curve": [], "reached": None},
            "handwritten": {"train_s": 0.0, "steps": 0, "curve": [], "reached": None}}
    steppers = {"local": local.train_step, "handwritten": hand.step}
    validators = {"local": lambda: local.validate()[VAL_KEY],
                  "handwritten": hand.greedy_accuracy}
    for name in runs:
        runs[name]["curve"].append((0, 0.0, validators[name]()))
    for step in range(1, max_steps + 1):
        active = [n for n, r in runs.items() if r["reached"] is None and r["train_s"] < cap_s]
        if not active:
            break
        for name in (active if step % 2 else active[::-1]):
            start = time.perf_counter()
            steppers[name]()
            runs[name]["train_s"] += time.perf_counter() - start
            runs[name]["steps"] = step
            if step % val_every == 0:
                acc = validators[name]()
                runs[name]["curve"].append((step, runs[name]["train_s"], acc))
                if acc >= target:
                    runs[name]["reached"] = {"step": step, "train_s": runs[name]["train_s"]}
    local.close()
    return runs


# ------------------------------------------------------------------- memory
def probe(variant: str, steps: int, threads: int) -> dict:
    """Run in a fresh process: build one variant, run `steps` steps, report peaks."""
    quiet_logs()
    set_threads(threads)
    out = {"variant": variant}
    if variant == "local":
        t = local_trainer(threads, ["trainer.val_every=0"])
        for _ in range(steps):
            t.train_step()
    elif variant == "handwritten":
        h = handwritten()
        for _ in range(steps):
            h.step()
    elif variant == "ray":
        r = RayStep(threads)
        for _ in range(steps):
            r.step()
        out["worker_peak_rss"] = sum(peak_rss_bytes(p) for p in r.worker_pids())
        r.close()
    elif variant == "trl":
        trl_trainer(2 * steps, _null_callback()).train()
    out["driver_peak_rss"] = peak_rss_bytes()
    out["peak_rss"] = out["driver_peak_rss"] + out.get("worker_peak_rss", 0)
    return out


def _null_callback():
    from transformers import TrainerCallback
    return TrainerCallback()


def memory(variants: list[str], steps: int, threads: int) -> dict:
    out = {}
    for variant in variants:
        proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--probe", variant,
                               "--probe-steps", str(steps), "--threads", str(threads)],
                              capture_output=True, text=True, timeout=600, cwd=ROOT)
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
        out[variant] = json.loads(lines[-1]) if lines else {"error": proc.stderr[-2000:]}
    return out


# ---------------------------------------------------------------------- run
def run(steps: int = 20, warmup: int = 2, threads: int = 1, with_ray: bool = True,
        with_trl: bool = True, with_accuracy: bool = True, with_memory: bool = True,
        target: float = 0.9, val_every: int = 2, acc_max_steps: int = 100,
        acc_cap_s: float = 150.0, probe_steps: int = 3, out: str | None = None,
        quiet: bool = False) -> dict:
    quiet_logs()
    set_threads(threads)
    payload: dict = {"machine": machine(), "steps": steps, "warmup": warmup,
                     "config": "graphs/grpo.py embedded default: 16 prompts x 8 samples, "
                               "4 new tokens, toy_base, 1 PPO epoch, mini-batch 64"}
    local, hand = local_trainer(threads, ["trainer.val_every=0"]), handwritten()
    variants = {"local": local.train_step, "handwritten": hand.step}
    ray_step = None
    if with_ray:
        ray_step = RayStep(threads)
        variants["ray"] = ray_step.step
    times = alternate(variants, steps, warmup)
    payload["step_s"] = {k: median(v) for k, v in times.items()}
    payload["step_samples_s"] = times
    if ray_step is not None:
        payload["ray_driver_bytes_per_step"] = ray_step.step()["driver_bytes"]
        ray_step.close()
    if with_trl and trl_available():
        matched = local_trainer(threads, ["trainer.val_every=0", *TRL_MATCHED])
        trl = run_trl({"local": local, "local_matched": matched}, steps, warmup)
        matched.close()
        payload["trl"] = {"trl_step_s": median(trl["trl_step_s"]),
                          "local_step_s": median(trl["local_step_s"]),
                          "local_matched_step_s": median(trl["local_matched_step_s"]),
                          "matched_overrides": TRL_MATCHED, "samples": trl}
    elif with_trl:
        payload["trl"] = {"skipped": "trl is not installed (pip install -e '.[bench]')"}
    local.close()
    if with_accuracy:
        payload["accuracy"] = time_to_accuracy(threads, target, val_every, acc_max_steps,
                                               acc_cap_s)
        payload["accuracy_target"] = target
    if with_memory:
        names = ["local", "handwritten"] + (["ray"] if with_ray else []) + \
            (["trl"] if with_trl and trl_available() else [])
        payload["memory"] = memory(names, probe_steps, threads)
    payload["targets"] = targets(payload)
    path = write_results("step", payload, out)
    if not quiet:
        print(report(payload))
        print(f"\nwrote {path}")
    return payload


def targets(p: dict) -> dict:
    s = p["step_s"]
    out = {"local_over_handwritten": s["local"] / s["handwritten"]}
    if "ray" in s:
        out["ray_over_handwritten"] = s["ray"] / s["handwritten"]
        out["ray_over_local"] = s["ray"] / s["local"]
    trl = p.get("trl", {})
    if "trl_step_s" in trl:
        out["trl_over_local"] = trl["trl_step_s"] / trl["local_step_s"]
    out["verdict"] = {"local_le_1.1x_handwritten":
                      out["local_over_handwritten"] <= TARGET_VS_HANDWRITTEN}
    if "trl_over_local" in out:
        out["trl_over_local_matched"] = trl["trl_step_s"] / trl["local_matched_step_s"]
        out["verdict"]["local_ge_1.5x_faster_than_trl"] = out["trl_over_local"] >= TARGET_VS_TRL
        out["verdict"]["local_matched_ge_1.5x_faster_than_trl"] = \
            out["trl_over_local_matched"] >= TARGET_VS_TRL
    return out


def report(p: dict) -> str:
    m = p["machine"]
    lines = [f"machine: {m['cpu']}, {m['cores']} cores, torch {m['torch']}, "
             f"torch threads {m['torch_threads']}, load {m['load_avg_1m_at_start']}",
             f"GRPO step ({p['config']}), median of {p['steps']} alternated steps"]
    mem = p.get("memory", {})
    rows = []
    for name in ("local", "ray", "handwritten"):
        if name in p["step_s"]:
            rows.append([name, p["step_s"][name] * 1e3,
                         p["step_s"][name] / p["step_s"]["handwritten"],
                         _mib(mem.get(name, {}).get("peak_rss"))])
    trl = p.get("trl", {})
    if "trl_step_s" in trl:
        rows.append(["trl (vs local in its own run)", trl["trl_step_s"] * 1e3,
                     trl["trl_step_s"] / trl["local_step_s"] * p["step_s"]["local"]
                     / p["step_s"]["handwritten"], _mib(mem.get("trl", {}).get("peak_rss"))])
        for key, label in (("local_step_s", "local (alternated with trl)"),
                           ("local_matched_step_s", "local, TRL's micro-batches (alt.)")):
            rows.append([label, trl[key] * 1e3, trl[key] / trl["local_step_s"]
                         * p["step_s"]["local"] / p["step_s"]["handwritten"], None])
    elif "skipped" in trl:
        lines.append(f"TRL: {trl['skipped']}")
    lines.append(table(["variant", "step ms", "x handwritten", "peak RSS MiB"], rows))
    acc = p.get("accuracy")
    if acc:
        arow = [[n, r["reached"]["step"] if r["reached"] else None,
                 r["reached"]["train_s"] if r["reached"] else None, r["steps"], r["train_s"],
                 r["curve"][-1][2]] for n, r in acc.items()]
        lines.append(f"time to {p['accuracy_target']} held-out greedy accuracy "
                     f"(training seconds, validation excluded):")
        lines.append(table(["variant", "step reached", "train s", "steps run", "train s run",
                            "last acc"], arow))
    lines.append("targets and ratios:")
    lines += [f"  {k}: {v}" for k, v in p["targets"].items()]
    return "\n".join(lines)


def _mib(value):
    return None if value is None else value / 2 ** 20


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--no-ray", action="store_true")
    parser.add_argument("--no-trl", action="store_true")
    parser.add_argument("--no-accuracy", action="store_true")
    parser.add_argument("--no-memory", action="store_true")
    parser.add_argument("--val-every", type=int, default=2)
    parser.add_argument("--acc-max-steps", type=int, default=100)
    parser.add_argument("--acc-cap-s", type=float, default=150.0)
    parser.add_argument("--probe", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--probe-steps", type=int, default=3)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    if args.probe:
        print(json.dumps(probe(args.probe, args.probe_steps, args.threads)))
        return
    run(args.steps, args.warmup, args.threads, not args.no_ray, not args.no_trl,
        not args.no_accuracy, not args.no_memory, val_every=args.val_every,
        acc_max_steps=args.acc_max_steps, acc_cap_s=args.acc_cap_s,
        probe_steps=args.probe_steps, out=args.out)


if __name__ == "__main__":
    main()
