"""`hybridflow check` cost: CPU and wall seconds of a fresh process checking each
shipped graph, against the budget that keeps `check` an instant pre-flight.

The CPU budget was a test assertion (tests/commands/test_cli_check.py) until it failed on a
loaded 2-core machine at 3.1 s; speed is measured here, where a miss is a number in
a report, not a red test. CPU time (user + sys of the child) is the figure to read:
on a shared machine wall time measures the neighbours.

    python bench/check.py [--graphs ppo grpo] [--reps 3] [--out bench/results/check.json]
"""
from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

from bench.harness import machine, median, table, write_results  # noqa: E402 - after the path

CPU_BUDGET_S = 3.0  # user + sys of one `hybridflow check` process
GRAPHS = ("ppo", "grpo")


def check_once(graph: str) -> tuple[float, float]:
    """(cpu seconds, wall seconds) of one `python -m hybridflow check graphs/<graph>.py`."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "hybridflow", "check",
                           os.path.join(REPO, "graphs", f"{graph}.py")],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise RuntimeError(f"hybridflow check graphs/{graph}.py failed:\n{proc.stderr}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return cpu, wall


def run(graphs=GRAPHS, reps: int = 3, out: str | None = None, quiet: bool = False) -> dict:
    rows = []
    for graph in graphs:
        cpu, wall = zip(*(check_once(graph) for _ in range(reps)))
        rows.append({"graph": graph, "reps": reps, "cpu_s_median": median(list(cpu)),
                     "cpu_s_max": max(cpu), "wall_s_median": median(list(wall))})
    worst = max(r["cpu_s_median"] for r in rows)
    payload = {"machine": machine(), "rows": rows,
               "targets": {"cpu_budget_s": CPU_BUDGET_S, "worst_cpu_s_median": worst,
                           "verdict": "within budget" if worst < CPU_BUDGET_S else "over budget"}}
    write_results("check", payload, out)
    if not quiet:
        print(report(payload))
    return payload


def report(payload: dict) -> str:
    rows = [[r["graph"], r["reps"], r["cpu_s_median"], r["cpu_s_max"], r["wall_s_median"]]
            for r in payload["rows"]]
    targets = payload["targets"]
    return (table(["graph", "reps", "cpu s (median)", "cpu s (max)", "wall s (median)"], rows)
            + f"\nbudget {targets['cpu_budget_s']} s of CPU: {targets['verdict']}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--graphs", nargs="+", default=list(GRAPHS))
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    payload = run(args.graphs, args.reps, args.out)
    return 0 if payload["targets"]["verdict"] == "within budget" else 1


if __name__ == "__main__":
    sys.exit(main())
