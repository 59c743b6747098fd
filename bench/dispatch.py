"""Engine overhead per node call: a no-op data-parallel method over 2 workers.

For a float32 batch [B, 128], B in {8, 512, 8192}, times one step of a graph with one
no-op call and one with a chain of 8 (PPO-shaped: every node feeds the next):

  (a) local runtime: source [B, 128] -> n1 (-> ... -> n8), 2 simulated ranks,
      against (a0) plain Python: the same split (row copies) / call / torch.cat by
      hand; timed before Ray starts (Ray's driver threads would add noise);
  (b) Ray runtime:   seeds -> make -> n1 (-> ... -> n8), the batch born on the 2
      workers (as rollouts are), so only metadata should reach the driver;
  (c) plain Ray:     the same calls on 2 plain actors with numpy shards, object
      references passed worker to worker and only waited on (a careful user's
      split/concat: split at the source, concatenation left as a list of refs);
  (c') plain Ray, driver split/concat: the batch split on the driver, sent, and
      the results fetched and concatenated there (every tensor through the driver,
      as verl's single controller does) -- for scale, one call only.

Variants are alternated call by call; medians of `--calls` steps. The bytes through
the driver are the tensor payload the driver puts or gets (the runtime's own
`driver_bytes`) plus, for (b), the pickled task descriptions and metas it sends
and receives (measured on one extra, untimed step).

    python bench/dispatch.py [--calls 200] [--sizes 8 512 8192] [--threads 1]
"""
from __future__ import annotations

import argparse
import os
import pickle
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import numpy as np
import torch

from bench import noop_workers
from bench.harness import alternate, machine, median, set_threads, table, write_results
from hybridflow.core.batch import Batch
from hybridflow.runtime.local import LocalRuntime

WORKERS = 2
TARGET_LOCAL_US = 50.0
TARGET_RAY_RATIO = 1.1        # the chain of 8 over plain Ray, B >= 512 (issue 37 item 4)
TARGET_RAY_RATIO_SMALL = 1.2  # the same at the smallest B (8 rows a call)
TARGET_DRIVER_FRACTION = 0.01


# ------------------------------------------------------------------ (a) local
class PlainNoop:
    def noop(self, x: torch.Tensor) -> torch.Tensor:
        return x


def python_step(workers, x: torch.Tensor, calls: int) -> torch.Tensor:
    """The local baseline: a hand-written split (row copies, as the runtime gives
    each rank rows of its own) and concatenation around each call."""
    for _ in range(calls):
        x = torch.cat([w.noop(s.clone()) for w, s in zip(workers, x.tensor_split(len(workers)))])
    return x


def local_variants(sizes, chain: int, threads: int = 1) -> tuple[dict, dict]:
    """name -> step callable, for every size and graph length."""
    variants, meta = {}, {}
    workers = [PlainNoop() for _ in range(WORKERS)]
    for calls in (1, chain):
        plan = noop_workers.noop_plan(calls, born_on_workers=False, workers=WORKERS)
        # the bench sets its threads; the local runtime would take every core by default
        runtime = LocalRuntime(plan, {"runtime": {"torch_threads": threads}})
        for b in sizes:
            x = torch.zeros(b, noop_workers.WIDTH)
            feeds = {"batch": Batch({"x0": x})}
            variants[("local", b, calls)] = lambda rt=runtime, f=feeds: rt.run_step(f)
            variants[("python", b, calls)] = lambda x=x, c=calls: python_step(workers, x, c)
            meta[("local", b, calls)] = meta[("python", b, calls)] = {"driver_bytes": 0}
    return variants, meta


# -------------------------------------------------------------------- (b) ray
def start_ray() -> None:
    import ray
    from ray import cloudpickle
    cloudpickle.register_pickle_by_value(noop_workers)
    if not ray.is_initialized():
        from hybridflow.runtime.ray.session import workers_at_driver_priority
        with workers_at_driver_priority():  # as a run's own Ray: workers at nice 0
            ray.init(num_cpus=8, num_gpus=4, include_dashboard=False)


def ray_runtime(threads: int):
    from hybridflow.runtime.ray.executor import RayRuntime
    plan = noop_workers.noop_plan(noop_workers.CHAIN, True, rows=4, workers=WORKERS)
    return RayRuntime(plan, {"runtime": {"call_timeout_s": 120, "torch_threads": threads}})


def ray_variants(runtime, sizes, chain: int) -> tuple[dict, dict, list]:
    variants, meta, keep = {}, {}, []
    feeds = {"seeds": Batch({"seed": torch.arange(WORKERS)})}
    for calls in (1, chain):
        for b in sizes:
            plan = noop_workers.noop_plan(calls, True, rows=b // WORKERS, workers=WORKERS)
            keep.append(plan)  # the runtime caches its analysis by id(plan)
            variants[("ray", b, calls)] = lambda p=plan: runtime.run_step(feeds, plan=p)
            meta[("ray", b, calls)] = {"plan": plan, "feeds": feeds}
    return variants, meta, keep


def measure_ray_driver_bytes(runtime, plan, feeds) -> dict:
    """One untimed step: the runtime's payload bytes, plus the pickled size of every
    task description sent and every meta received."""
    from hybridflow.runtime import scheduler
    from hybridflow.runtime.worker_shell import encode_task
    sent, received = [], []
    task_fn, arrived_fn = scheduler.StepScheduler._task, scheduler.StepScheduler._arrived

    def task(self, *args, **kwargs):
        out = task_fn(self, *args, **kwargs)
        sent.append(len(encode_task(out)))  # the bytes the Ray runtime sends
        return out

    def arrived(self, ref, record):
        received.append(len(pickle.dumps(record.meta, protocol=5)))
        return arrived_fn(self, ref, record)

    scheduler.StepScheduler._task, scheduler.StepScheduler._arrived = task, arrived
    try:
        result = runtime.run_step(feeds, plan=plan)
    finally:
        scheduler.StepScheduler._task, scheduler.StepScheduler._arrived = task_fn, arrived_fn
    return {"payload": result.driver_bytes, "control": sum(sent) + sum(received),
            "tasks": len(sent)}


# --------------------------------------------------------------- (c) plain Ray
class PlainWorker:
    """What a careful user writes by hand: numpy shards (zero-copy in Ray's store)."""

    def __init__(self, threads: int):
        torch.set_num_threads(threads)

    def make(self, seed: np.ndarray, rows: int, width: int) -> np.ndarray:
        return np.zeros((rows * len(seed), width), dtype=np.float32)

    def noop(self, x: np.ndarray) -> np.ndarray:
        return x


def plain_actors(threads: int) -> list:
    import ray
    cls = ray.remote(num_cpus=1, num_gpus=1)(PlainWorker)
    actors = [cls.remote(threads) for _ in range(WORKERS)]
    ray.get([a.__ray_ready__.remote() for a in actors])
    return actors


def plain_step(actors, rows: int, calls: int) -> None:
    import ray
    xs = [a.make.remote(np.array([r]), rows, noop_workers.WIDTH) for r, a in enumerate(actors)]
    for _ in range(calls):
        xs = [a.noop.remote(x) for a, x in zip(actors, xs)]
    ray.wait(xs, num_returns=len(xs), fetch_local=False)


def driver_step(actors, batch: np.ndarray) -> np.ndarray:
    import ray
    shards = np.array_split(batch, len(actors))
    return np.concatenate(ray.get([a.noop.remote(s) for a, s in zip(actors, shards)]))


def plain_variants(actors, sizes, chain: int) -> tuple[dict, dict]:
    variants, meta = {}, {}
    for calls in (1, chain):
        for b in sizes:
            variants[("plain", b, calls)] = \
                lambda r=b // WORKERS, c=calls: plain_step(actors, r, c)
            meta[("plain", b, calls)] = {"driver_bytes": 8 * WORKERS}  # the seeds
    for b in sizes:
        batch = np.zeros((b, noop_workers.WIDTH), dtype=np.float32)
        variants[("driver", b, 1)] = lambda x=batch: driver_step(actors, x)
        meta[("driver", b, 1)] = {"driver_bytes": 2 * batch.nbytes}
    return variants, meta


# ----------------------------------------------------------------------- run
def run(sizes=(8, 512, 8192), calls: int = 200, warmup: int = 20, threads: int = 1,
        chain: int = noop_workers.CHAIN, with_ray: bool = True, out: str | None = None,
        quiet: bool = False) -> dict:
    set_threads(threads)
    rows = []
    local, meta = local_variants(sizes, chain, threads)  # before Ray: its driver threads add noise
    rows += time_groups(local, meta, sizes, chain, calls, warmup)
    variants, runtime, actors = {}, None, []
    if with_ray:
        start_ray()
        runtime = ray_runtime(threads)
        rv, rmeta, _keep = ray_variants(runtime, sizes, chain)
        actors = plain_actors(threads)
        pv, pmeta = plain_variants(actors, sizes, chain)
        variants.update(rv), variants.update(pv), meta.update(pmeta)
        for key, m in rmeta.items():
            meta[key] = measure_ray_driver_bytes(runtime, m["plan"], m["feeds"])
    try:
        rows += time_groups(variants, meta, sizes, chain, calls, warmup)
    finally:
        if runtime is not None:
            runtime.shutdown()
        if actors:
            import ray
            for a in actors:
                ray.kill(a)
    payload = {"machine": machine(), "workers": WORKERS, "width": noop_workers.WIDTH,
               "calls": calls, "warmup": warmup, "rows": rows,
               "targets": targets(rows, chain)}
    path = write_results("dispatch", payload, out)
    if not quiet:
        print(report(payload))
        print(f"\nwrote {path}")
    return payload


def time_groups(variants, meta, sizes, chain, calls, warmup) -> list[dict]:
    """Alternate every variant of one (size, graph length), call by call."""
    rows = []
    for b in sizes:
        for calls_ in (1, chain):
            group = {k[0]: v for k, v in variants.items() if k[1] == b and k[2] == calls_}
            if not group:
                continue
            for kind, ts in alternate(group, calls, warmup).items():
                m = meta[(kind, b, calls_)]
                rows.append({"variant": kind, "B": b, "calls_per_step": calls_,
                             "median_us": median(ts) * 1e6,
                             "p90_us": float(np.percentile(ts, 90)) * 1e6,
                             "batch_bytes": b * noop_workers.WIDTH * 4,
                             "driver_payload_bytes": m.get("payload", m.get("driver_bytes")),
                             "driver_control_bytes": m.get("control"), "reps": len(ts)})
    return rows


def _row(rows, kind, b, calls):
    return next((r for r in rows if r["variant"] == kind and r["B"] == b
                 and r["calls_per_step"] == calls), None)


def targets(rows: list[dict], chain: int) -> dict:
    out = {}
    sizes = sorted({r["B"] for r in rows})
    for b in sizes:
        local1, localn = _row(rows, "local", b, 1), _row(rows, "local", b, chain)
        python1, pythonn = _row(rows, "python", b, 1), _row(rows, "python", b, chain)
        entry = {"local_step_1call_us": local1["median_us"],
                 "local_per_node_in_chain_us": localn["median_us"] / chain,
                 "local_over_python_1call": local1["median_us"] / python1["median_us"],
                 "local_over_python_chain": localn["median_us"] / pythonn["median_us"]}
        ray1, plain1 = _row(rows, "ray", b, 1), _row(rows, "plain", b, 1)
        rayn, plainn = _row(rows, "ray", b, chain), _row(rows, "plain", b, chain)
        if ray1 and plain1:
            entry["ray_over_plain_1call"] = ray1["median_us"] / plain1["median_us"]
            entry["ray_over_plain_chain"] = rayn["median_us"] / plainn["median_us"]
            entry["ray_driver_fraction_1call"] = \
                (ray1["driver_payload_bytes"] + ray1["driver_control_bytes"]) / ray1["batch_bytes"]
            entry["ray_driver_bytes_per_call"] = \
                (rayn["driver_payload_bytes"] + rayn["driver_control_bytes"]) / (chain + 1)
        out[str(b)] = entry
    big, small = out[str(max(sizes))], out[str(min(sizes))]
    out["verdict"] = {
        f"local_noop_call_le_50us(B={min(sizes)}, 1-call step)":
            small["local_step_1call_us"] <= TARGET_LOCAL_US,
        f"local_noop_call_le_50us(B={min(sizes)}, per node in chain)":
            small["local_per_node_in_chain_us"] <= TARGET_LOCAL_US,
    }
    if "ray_over_plain_1call" in big:
        for b in sizes:  # the chain: a PPO-shaped step
            limit = TARGET_RAY_RATIO_SMALL if b == min(sizes) else TARGET_RAY_RATIO
            out["verdict"][f"ray_chain_le_{limit}x_plain(B={b})"] = \
                out[str(b)]["ray_over_plain_chain"] <= limit
        out["verdict"][f"ray_driver_lt_1pct(B={max(sizes)})"] = \
            big["ray_driver_fraction_1call"] < TARGET_DRIVER_FRACTION
    return out


def report(payload: dict) -> str:
    m = payload["machine"]
    head = (f"machine: {m['cpu']}, {m['cores']} cores, torch {m['torch']}, "
            f"torch threads {m['torch_threads']}, load {m['load_avg_1m_at_start']}\n"
            f"no-op DP call over {payload['workers']} workers, float32 [B, {payload['width']}], "
            f"median of {payload['calls']} steps (alternated)\n")
    rows = [[r["variant"], r["B"], r["calls_per_step"], r["median_us"],
             r["median_us"] / r["calls_per_step"], r["p90_us"], r["driver_payload_bytes"],
             r["driver_control_bytes"], r["batch_bytes"]] for r in payload["rows"]]
    body = table(["variant", "B", "calls/step", "step µs", "µs/call", "p90 µs",
                  "driver payload B", "driver control B", "batch B"], rows)
    tgt = "\n".join(f"  {k}: {v}" for k, v in payload["targets"].items())
    return head + body + "\ntargets and ratios:\n" + tgt


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--sizes", type=int, nargs="+", default=[8, 512, 8192])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--no-ray", action="store_true")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    run(tuple(args.sizes), args.calls, args.warmup, args.threads, with_ray=not args.no_ray,
        out=args.out)


if __name__ == "__main__":
    main()
