"""How long a Ray pool takes to start beside busy processes, with Ray's workers at
Ray's default priority (nice 15) and at the driver's (nice 0, what a run's own Ray
uses: hybridflow/runtime/ray/session.py).

Each repetition starts a fresh driver process that starts Ray (`RAY_worker_niceness`
set to the variant's value), creates `--actors` actors that import torch in their
constructor (what the engine's workers do first) and times until all are ready; the
variants alternate, the first rotating every round. `--busy` CPU-bound processes at
nice 0 run the whole time (what another job, or the test suite's other worker,
does); `--busy 0` measures an idle machine.

    python bench/ray_priority.py [--reps 3] [--busy 2] [--actors 2]

Prints a table and the ratio (nice 15 over nice 0); writes
bench/results/ray_priority.json.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from bench.harness import machine, median, table, write_results

NICENESS = {"ray default (nice 15)": 15, "driver's (nice 0)": 0}

DRIVER = """
import json, sys, time
import ray
actors = int(sys.argv[1])
t0 = time.perf_counter()
ray.init(address="local", num_cpus=max(2, actors), include_dashboard=False,
         log_to_driver=False)
t1 = time.perf_counter()

@ray.remote(num_cpus=1)
class Worker:
    def __init__(self):
        import torch  # what an engine worker imports first
        self.n = torch.get_num_threads()

    def ready(self):
        import os
        return os.nice(0)

nice = ray.get([Worker.remote().ready.remote() for _ in range(actors)])
t2 = time.perf_counter()
ray.shutdown()
print(json.dumps({"init_s": t1 - t0, "actors_s": t2 - t1, "worker_nice": nice}))
"""


def _spin() -> None:
    while True:
        pass


def start_once(niceness: int, actors: int, timeout_s: float) -> dict:
    env = {**os.environ, "RAY_worker_niceness": str(niceness)}
    out = subprocess.run([sys.executable, "-c", DRIVER, str(actors)], env=env,
                         capture_output=True, text=True, timeout=timeout_s)
    if out.returncode != 0:
        raise RuntimeError(f"the driver failed (nice {niceness}):\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def run(reps: int, busy: int, actors: int, timeout_s: float = 600.0) -> dict:
    burners = [multiprocessing.Process(target=_spin, daemon=True) for _ in range(busy)]
    for proc in burners:
        proc.start()
    rows = {name: [] for name in NICENESS}
    try:
        names = list(NICENESS)
        for i in range(reps):
            k = i % len(names)
            for name in names[k:] + names[:k]:
                rows[name].append(start_once(NICENESS[name], actors, timeout_s))
    finally:
        for proc in burners:
            proc.terminate()
    summary = {name: {"niceness": NICENESS[name],
                      "actors_s": median([r["actors_s"] for r in runs]),
                      "init_s": median([r["init_s"] for r in runs]),
                      "worker_nice": runs[0]["worker_nice"], "runs": runs}
               for name, runs in rows.items()}
    slow, fast = (summary[n]["actors_s"] for n in NICENESS)
    return {"machine": machine(), "busy": busy, "actors": actors, "reps": reps,
            "variants": summary, "nice15_over_nice0": slow / fast}


def report(payload: dict) -> str:
    rows = [[name, v["niceness"], v["worker_nice"][0], v["init_s"], v["actors_s"]]
            for name, v in payload["variants"].items()]
    return (table(["workers at", "RAY_worker_niceness", "seen", "ray.init s",
                   f"{payload['actors']} actors ready s"], rows)
            + f"\nbeside {payload['busy']} busy process(es): nice 15 / nice 0 = "
              f"{payload['nice15_over_nice0']:.2f}x")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--busy", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--actors", type=int, default=2)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    payload = run(args.reps, args.busy, args.actors)
    print(report(payload))
    print(f"\nwrote {write_results('ray_priority', payload, args.out)}")


if __name__ == "__main__":
    main()
