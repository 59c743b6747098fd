"""Async training (issues 15 and 31): steps per second, time to 0.9 held-out greedy
accuracy, busy fractions and driver bytes of the synchronous run (`0`), the one-step
pipelined one (`1`) and streaming at k = 2 (`s2`), alternated in one Ray session.

Every variant is the embedded GRPO (graphs/grpo.py: the shipped toy base model, the
toy arithmetic task, the KL loss on) on the Ray runtime with the rollout on a pool
of its own (`placement.pools.gen.devices_per_node=1 placement.roles.rollout=gen`),
and by default the rest of the rollout side (reference, reward) beside it: one
worker process generates, another (the actor) trains, `runtime.torch_threads` torch
threads each. With `--pin` (the default where this process may use two cores) each
pool's worker is pinned to a core of its own (`placement.pools.<name>.cores`: main on
the first core, gen on the second), so the two sides overlap on the hardware's cores,
not on the OS scheduler's choice; the driver is not pinned. Only the load changes
from the embedded default: `--prompts` x `--n` rows a step and `--max-new-tokens`,
chosen so that the two pools work about as long (the base model rarely stops after
its answer, so its responses run to `max_new_tokens` until RL teaches it to stop).

One alternated run: each repetition starts a fresh trainer per variant from the base
model (seed = repetition + 1, the same for every variant) in one Ray session, then
steps them one step each in turn (the first variant rotating every step). Two
phases: learning (`--steps`, greedy accuracy validated every `--val-every` steps,
not timed) and fixed policy (`--fixed-steps` with `actor.lr=0`: the same work every
step in every variant). Per repetition and variant:
  - steps/s: 1 / median step time over the steady window (steps after `--warmup`
    and before the last k steps, which have nothing left to generate ahead);
  - time to 0.9: training seconds (every step, warm-up included) up to the first
    validation at or above `--target-accuracy`;
  - `async/staleness/mean|max`, `async/ahead`, `perf/busy/<pool>`, each pool's
    seconds of work, its worker's CPU seconds per busy second (below 1: waiting
    for a core), the driver's CPU a step, and how many cores two processes got at
    once around the repetition (bench/cpu.py);
  - driver bytes a step (`engine/driver_bytes`: every byte the driver sent or
    received for the step) against the samples' bytes a step (the synchronous run's
    `rollout.generate` output, dumped at its last learning step by
    `trainer.dump_batches`: tensor bytes plus the pickled other columns).
The overlap bound of the placement (issue 31): the synchronous step over its busier
side, 1 / max(busy gen, busy main) of the synchronous run -- the speed-up if the
lighter side hid entirely behind the busier one, both keeping their synchronous
speed (the driver's own time between tasks hides too, so the bound is generous).
Ratios are taken within a repetition (same seed, same minutes of machine load), then
the median over repetitions is reported (bench/async_report.py).

`--streaming 2` adds the variant `s2`: `trainer.staleness=2 trainer.async_mode=streaming`
(the rollout engine generating continuously on its own thread, docs/async.md; the
nodes that can run on whole groups on the rollout's pool join the stream side,
`trainer.stream_side=auto`); `--generate-only` adds `s2g`, the same with
`trainer.stream_side=generate_only` (only generation on the stream side).

Async runs need an off-policy choice: `actor.off_policy=tis` when this tree has it,
else `trainer.allow_uncorrected_async=true` (`--off-policy` forces one).

    python bench/async.py [--reps 5] [--steps 30] [--fixed-steps 12] [--prompts 16]
                          [--n 8] [--max-new-tokens 32] [--staleness 0 1 2]
                          [--streaming 1 2] [--pin auto|on|off]
                          [--rollout-side-on gen|main] [--out PATH]
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, ROOT)

from bench.async_report import (median_row, ratios, rep_table, report,  # noqa: E402
                                targets, variant_name)
from bench.cpu import machine_parallelism, process_cpu_s  # noqa: E402
from bench.harness import machine, median, quiet_logs, set_threads, write_results  # noqa: E402

GRPO = os.path.join(ROOT, "graphs", "grpo.py")
VAL_KEY = "val/toy_arith/greedy"
TRAIN_NODES = ("actor.logprob", "actor.update")
ROLLOUT_SIDE_NODES = ("ref.logprob", "reward.score")  # on --rollout-side-on
SAMPLES_NODE = "rollout.generate"  # its output is what a step's samples weigh


def off_policy_override(choice: str) -> tuple[str, str]:
    """(what the async runs used, its override). 'auto': the TIS correction when the
    actor's config has `off_policy` (another engineer's work), else uncorrected."""
    if choice == "auto":
        import dataclasses

        from hybridflow.workers.config import ActorConfig
        names = {f.name for f in dataclasses.fields(ActorConfig)}
        choice = "tis" if "off_policy" in names else "uncorrected"
    if choice == "uncorrected":
        return choice, "trainer.allow_uncorrected_async=true"
    return choice, f"actor.off_policy={choice}"


def staleness_of(key) -> int:
    """A variant's staleness: its key (pipelined, int) or "s<k>" (streaming)."""
    return int(key[1:].rstrip("g")) if isinstance(key, str) else int(key)


def overrides(args, key, seed: int, correction: str, fixed: bool) -> list[str]:
    """The run's overrides; `fixed`: a learning rate of 0 and no validation (the
    policy, hence every step's work, stays the base model's)."""
    k = staleness_of(key)
    mode = ["trainer.async_mode=streaming"] if isinstance(key, str) else []
    if isinstance(key, str) and key.endswith("g"):  # the stream side: generation only
        mode.append("trainer.stream_side=generate_only")
    val_every, steps = (0, args.fixed_steps) if fixed else (args.val_every, args.steps)
    rollout = ["placement.roles.rollout=gen"] if args.rollout_on == "gen" else []
    pins = [f"placement.pools.{pool}.cores=[{core}]" for pool, core in args.cores.items()]
    dump = [f"trainer.dump_batches=[{steps}]"] if k == 0 and not fixed else []
    out = ["runtime.name=ray", "placement.pools.gen.devices_per_node=1",
           *rollout, *side_roles(args.rollout_side_on), *pins, *dump,
           f"runtime.torch_threads={args.threads}",
           f"trainer.staleness={k}", f"trainer.steps={steps}", f"trainer.seed={seed}",
           f"trainer.val_every={val_every}", *(["trainer.val_samples=1"] if val_every else []),
           "trainer.progress=false", f"data.batch_size={args.prompts}", f"rollout.n={args.n}",
           f"rollout.max_new_tokens={args.max_new_tokens}",
           f"rollout.micro_batch_size={args.prompts * args.n}"]
    return out + mode + ([correction] if k else []) + (["actor.lr=0"] if fixed else []) \
        + list(args.extra)


def _rollout_words(pool: str) -> str:
    return "its own pool" if pool == "gen" else "colocated with the actor"


def side_roles(pool: str) -> list[str]:
    """Where the rollout side's other calls (reference log-probs, reward) run. On the
    main pool they are queued on the actor's worker ahead of the train side and wait
    for the generation they read (see docs/benchmarks.md, Async): 'gen' keeps the
    train side free to start at once."""
    return [f"placement.roles.ref={pool}", f"placement.roles.reward={pool}"]


class Variant:
    """One trainer (fresh from the base model) and what its steps measured."""

    def __init__(self, args, key, seed: int, correction: str, fixed: bool = False):
        from hybridflow.run.loop import Trainer
        from hybridflow.program.assemble import prepare
        from hybridflow.run.tracking import RunDir
        self.key, self.k = key, staleness_of(key)
        self.name = variant_name(key)
        loaded = prepare(GRPO, overrides(args, key, seed, correction, fixed))
        self.run_dir = RunDir(tempfile.mkdtemp(prefix=f"bench-async-{key}-"))
        self.trainer = Trainer(loaded, self.run_dir)
        self.steps: list[dict] = []           # train_step metrics, one per step
        self.accuracy: list[tuple[int, float]] = []  # (step, greedy accuracy)
        self.val_every = 0 if fixed else args.val_every
        self.pids = self.worker_pids()

    def cpu_seconds(self) -> dict[str, float]:
        """CPU seconds used so far by each pool's workers and by this (driver) process."""
        out = {pool: sum(process_cpu_s(pid) for pid in pids) for pool, pids in self.pids.items()}
        return {**out, "driver": time.process_time()}  # finer than /proc's 10 ms ticks

    def validate(self) -> None:
        self.accuracy.append((self.trainer.step, self.trainer.validate()[VAL_KEY]))

    def step(self) -> None:
        self.trainer.step += 1
        before = self.cpu_seconds()
        metrics = self.trainer.train_step()
        after = self.cpu_seconds()
        metrics.update({f"cpu_s/{name}": after[name] - before[name] for name in after})
        self.steps.append(metrics)
        if self.val_every and self.trainer.step % self.val_every == 0:
            self.validate()

    def worker_pids(self) -> dict[str, list[int]]:
        runtime = self.trainer.runtime
        return {pool: [info["pid"] for info in runtime.worker_info(pool)]
                for pool in ("main", "gen")}

    def sample_bytes(self) -> int | None:
        """The bytes of the samples of the step dumped (`trainer.dump_batches`), if any."""
        import glob
        import pickle

        from hybridflow.run.batch_dump import load_batch
        found = sorted(glob.glob(os.path.join(self.run_dir.path, "batches", "step_*",
                                              f"{SAMPLES_NODE}.pt")))
        if not found:
            return None
        record = load_batch(found[-1])
        return (sum(t.numel() * t.element_size() for t in record["tensors"].values())
                + len(pickle.dumps(record["columns"], protocol=5)))

    def close(self) -> None:
        self.trainer.close()


def cpu_share(steady: list[dict], pool: str) -> float | None:
    """CPU seconds a pool's worker process used per second it was inside a task:
    below 1, its tasks waited for a core (or blocked). Ray's own threads in the
    worker count too, so an idle-free worker can show a little above 1."""
    busy = sum(m.get(f"perf/busy/{pool}", 0.0) * m["perf/time_per_step"] for m in steady)
    return sum(m[f"cpu_s/{pool}"] for m in steady) / busy if busy else None


def pool_seconds(med, side_on: str) -> dict[str, float]:
    """Median seconds of work a step puts on each pool (node timings summed)."""
    work = {"gen": med("timing_s/rollout.generate") or 0.0,
            "main": sum(med(f"timing_s/{n}") or 0.0 for n in TRAIN_NODES)}
    work[side_on] += sum(med(f"timing_s/{n}") or 0.0 for n in ROLLOUT_SIDE_NODES)
    return work


def summarize(v: Variant, window: range, target: float, side_on: str) -> dict:
    """Steady-state figures over `window` (0-based step indices) and time to target."""
    steady = [v.steps[i] for i in window]
    step_s = median([m["perf/time_per_step"] for m in steady])

    def med(key):
        values = [m[key] for m in steady if key in m]
        return median(values) if values else None

    work = pool_seconds(med, side_on)
    reached, seconds = None, None
    for step, accuracy in v.accuracy:
        if accuracy >= target:
            reached = step
            seconds = sum(m["perf/time_per_step"] for m in v.steps[:step])
            break
    stale = [m for m in v.steps if "async/staleness/mean" in m]
    return {
        "staleness": v.key, "step_s": step_s, "steps_per_s": 1.0 / step_s,
        "all_steps_s": sum(m["perf/time_per_step"] for m in v.steps),
        "generate_s": med("timing_s/rollout.generate"),
        "gen_pool_s": work["gen"], "main_pool_s": work["main"],
        "response_length": med("response_length/mean"),
        "busy_main": med("perf/busy/main"), "busy_gen": med("perf/busy/gen"),
        "ahead": med("async/ahead"),
        "driver_bytes": med("engine/driver_bytes"),
        "busy_gen_s": (med("perf/busy/gen") or 0.0) * step_s,
        "busy_main_s": (med("perf/busy/main") or 0.0) * step_s,
        "cpu_share_gen": cpu_share(steady, "gen"), "cpu_share_main": cpu_share(steady, "main"),
        "driver_cpu_s": sum(m["cpu_s/driver"] for m in steady) / len(steady),
        "staleness_mean": (sum(m["async/staleness/mean"] for m in stale) / len(stale)
                           if stale else 0.0),
        "staleness_max": max((m["async/staleness/max"] for m in stale), default=0.0),
        "step_reached": reached, "time_to_accuracy_s": seconds,
        "accuracy": v.accuracy,
    }


def repetition(args, rep: int, correction: str, fixed: bool) -> dict[int, dict]:
    """Fresh trainers for every variant, stepped in turn; their summaries by k."""
    seed, steps = rep + 1, args.fixed_steps if fixed else args.steps
    parallelism = [machine_parallelism()]  # before and after: the load of the moment
    variants = [Variant(args, key, seed, correction, fixed) for key in args.variants]
    try:
        if args.profile:  # where to point py-spy
            for v in variants:
                print(f"{v.name}: driver {os.getpid()}, workers {v.worker_pids()}", flush=True)
        if not fixed:
            for v in variants:
                v.validate()  # step 0: the base model (also warms the validation plan)
        for i in range(steps):
            first = (rep + i) % len(variants)
            for v in variants[first:] + variants[:first]:
                v.step()
    finally:
        for v in variants:
            v.close()
    window = range(args.warmup, steps - max(map(staleness_of, args.variants)))
    parallelism.append(machine_parallelism())
    samples = variants[0].sample_bytes()  # the synchronous run's, learning phase only
    return {v.key: {**summarize(v, window, args.target_accuracy, args.rollout_side_on),
                    "machine_parallelism": sum(parallelism) / 2, "sample_bytes": samples}
            for v in variants}


def phase(args, correction: str, fixed: bool) -> dict:
    """Every repetition of one phase, and its medians and ratios."""
    reps = []
    for rep in range(args.reps):
        reps.append(repetition(args, rep, correction, fixed))
        if not args.quiet:
            print(rep_table(reps[-1], rep, fixed), flush=True)
    return {"reps": [{str(k): r for k, r in rep.items()} for rep in reps],
            "rows": [median_row(reps, key) for key in args.variants],
            "ratios": {str(key): ratios(reps, key) for key in args.variants if key != 0}}


def run(args) -> dict:
    import ray
    quiet_logs()
    set_threads(args.threads)  # the driver's too (it runs the loader and small fn nodes)
    correction, _ = off_policy_override(args.off_policy)
    _, correction_override = off_policy_override(correction)
    # Ray starts its workers at nice 15: on a machine shared with other jobs they then
    # get the CPU last, while the driver does not (see docs/benchmarks.md, Async)
    os.environ["RAY_worker_niceness"] = str(args.worker_niceness)
    started = not ray.is_initialized()
    if started:  # two logical GPUs (pools main and gen) a variant
        ray.init(num_cpus=8, num_gpus=2 * len(args.variants), include_dashboard=False,
                 log_to_driver=False)
    start, at_start = time.perf_counter(), machine()  # the load when the run began
    try:
        learning = phase(args, correction_override, fixed=False)
        fixed = phase(args, correction_override, fixed=True) if args.fixed_steps else None
    finally:
        if started:
            ray.shutdown()
    payload = {
        "machine": at_start,
        "setup": {"graph": "graphs/grpo.py (embedded default model and task)",
                  "placement": f"pools main (actor) and gen, 1 worker each; rollout on "
                               f"{args.rollout_on} ({_rollout_words(args.rollout_on)}); "
                               f"ref and reward on {args.rollout_side_on}",
                  "extra_overrides": list(args.extra),
                  "prompts": args.prompts, "n": args.n, "max_new_tokens": args.max_new_tokens,
                  "steps": args.steps, "warmup": args.warmup, "val_every": args.val_every,
                  "fixed_policy_steps": args.fixed_steps,
                  "reps": args.reps, "torch_threads": args.threads,
                  "worker_niceness": args.worker_niceness, "pinned_cores": args.cores,
                  "staleness": args.staleness, "streaming": args.streaming,
                  "target_accuracy": args.target_accuracy,
                  "off_policy": correction, "off_policy_override": correction_override},
        **learning,
        "fixed_policy": fixed,
        "wall_s": time.perf_counter() - start,
    }
    payload["targets"] = targets(payload)
    path = write_results("async", payload, args.out)
    if not args.quiet:
        print(report(payload))
        print(f"-> {path}")
    return payload


def parse(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--fixed-steps", type=int, default=12,
                        help="steps of the fixed-policy phase (0: skip it)")
    parser.add_argument("--warmup", type=int, default=2, help="steps left out of steps/s")
    parser.add_argument("--val-every", type=int, default=2)
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--staleness", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--streaming", type=int, nargs="*", default=[],
                        help="staleness values also run with trainer.async_mode=streaming "
                             "(variants s<k>, alternated with the others)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads a worker")
    parser.add_argument("--target-accuracy", type=float, default=0.9)
    parser.add_argument("--off-policy", default="auto",
                        choices=["auto", "tis", "decoupled", "uncorrected"])
    parser.add_argument("--profile", action="store_true", help="print worker pids")
    parser.add_argument("--out", default=None)
    parser.add_argument("--quiet", action="store_true")
    parser.add_argument("--rollout-side-on", default="gen", choices=["gen", "main"],
                        help="pool of the reference and reward roles")
    parser.add_argument("--rollout-on", default="gen", choices=["gen", "main"],
                        help="pool of the rollout role: 'main' colocates it with the actor "
                             "(generation and training cannot overlap)")
    parser.add_argument("--worker-niceness", type=int, default=0,
                        help="nice level of the Ray workers (Ray's default is 15)")
    parser.add_argument("--generate-only", action="store_true",
                        help="also run each --streaming k with trainer.stream_side="
                             "generate_only (variants s<k>g)")
    parser.add_argument("--pin", default="auto", choices=["auto", "on", "off"],
                        help="pin pool main to the first core this process may use and "
                             "gen to the second (auto: when there are two)")
    parser.add_argument("--extra", nargs="*", default=[], help="more key=value overrides")
    args = parser.parse_args(argv)
    args.cores = pool_cores(args.pin)
    if args.pin == "on" and not args.cores:
        parser.error("--pin on needs two cores this process may use "
                     f"(os.sched_getaffinity: {sorted(os.sched_getaffinity(0))})")
    if 0 not in args.staleness:
        parser.error("--staleness must include 0 (the ratios are against it)")
    args.staleness = sorted(set(args.staleness))
    if any(k < 1 for k in args.streaming):
        parser.error("--streaming values must be >= 1 (streaming needs a staleness bound)")
    args.variants = args.staleness + [f"s{k}{g}" for g in ("", "g")[:1 + args.generate_only]
                                      for k in sorted(set(args.streaming))]
    for steps in (args.steps, args.fixed_steps or args.steps):
        if steps <= args.warmup + max(map(staleness_of, args.variants)):
            parser.error("--steps and --fixed-steps must exceed --warmup plus the "
                         "largest staleness")
    return args


def pool_cores(pin: str) -> dict[str, int]:
    """pool -> the core its worker is pinned to; {} when not pinned."""
    cores = sorted(os.sched_getaffinity(0))
    if pin == "off" or len(cores) < 2:
        return {}
    return {"main": cores[0], "gen": cores[1]}


def main(argv=None) -> None:
    run(parse(argv))


if __name__ == "__main__":
    main()
