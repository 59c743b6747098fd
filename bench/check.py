"""`hybridflow check` cost: CPU and wall seconds of a fresh process checking each
shipped graph, against `import torch` alone measured alternately in the same run, and
against the budget that keeps `check` an instant pre-flight.

The CPU budget was a test assertion (tests/commands/test_cli_check.py) until it failed on a
loaded 2-core machine at 3.1 s; speed is measured here, where a miss is a number in
a report, not a red test (tests/graphs/test_graph_files_check_light.py asserts what
`check` must not import). CPU time (user + sys of the child) is the figure to read:
on a shared machine wall time measures the neighbours. The ratio to a bare
`python -c "import torch"` (issue 37: under 2x) says what `check` costs beyond the
one library it cannot do without; each repetition runs every process once, the first
rotating, so a neighbour's burst falls on all of them alike.

    python bench/check.py [--graphs sft ppo grpo] [--reps 5] [--out bench/results/check.json]
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
RATIO_TARGET = 2.0  # check's CPU seconds over a bare `import torch`'s (issue 37)
GRAPHS = ("sft", "ppo", "grpo")
TORCH = "import torch"  # the baseline variant's name


def child_once(argv: list[str]) -> tuple[float, float]:
    """(cpu seconds, wall seconds) of one fresh `python ARGV...` process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, *argv], cwd=REPO, capture_output=True,
                          text=True, timeout=300)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise RuntimeError(f"python {' '.join(argv)} failed:\n{proc.stderr}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return cpu, wall


def variants(graphs) -> dict[str, list[str]]:
    """{name: python argv}: the bare torch import, then `check` of each graph."""
    out = {TORCH: ["-c", "import torch"]}
    for graph in graphs:
        out[graph] = ["-m", "hybridflow", "check", os.path.join(REPO, "graphs", f"{graph}.py")]
    return out


def measure(argvs: dict[str, list[str]], reps: int) -> dict[str, list[tuple[float, float]]]:
    """`reps` (cpu, wall) pairs per variant, one of each in turn, the first rotating."""
    names = list(argvs)
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in names}
    for i in range(reps):
        k = i % len(names)
        for name in names[k:] + names[:k]:
            times[name].append(child_once(argvs[name]))
    return times


def run(graphs=GRAPHS, reps: int = 5, out: str | None = None, quiet: bool = False) -> dict:
    times = measure(variants(graphs), reps)
    torch_cpu = median([c for c, _ in times[TORCH]])
    torch_wall = median([w for _, w in times[TORCH]])
    rows = []
    for name, pairs in times.items():
        cpu, wall = [c for c, _ in pairs], [w for _, w in pairs]
        rows.append({"graph": name, "reps": reps, "cpu_s_median": median(cpu),
                     "cpu_s_max": max(cpu), "wall_s_median": median(wall),
                     "cpu_ratio_to_torch": median(cpu) / torch_cpu,
                     "wall_ratio_to_torch": median(wall) / torch_wall})
    checks = [r for r in rows if r["graph"] != TORCH]
    worst = max(r["cpu_s_median"] for r in checks)
    worst_ratio = max(r["cpu_ratio_to_torch"] for r in checks)
    within = worst < CPU_BUDGET_S and worst_ratio < RATIO_TARGET
    payload = {"machine": machine(), "rows": rows,
               "targets": {"cpu_budget_s": CPU_BUDGET_S, "worst_cpu_s_median": worst,
                           "ratio_target": RATIO_TARGET, "worst_cpu_ratio": worst_ratio,
                           "verdict": "within budget" if within else "over budget"}}
    write_results("check", payload, out)
    if not quiet:
        print(report(payload))
    return payload


def report(payload: dict) -> str:
    rows = [[r["graph"], r["reps"], r["cpu_s_median"], r["cpu_s_max"], r["wall_s_median"],
             r["cpu_ratio_to_torch"], r["wall_ratio_to_torch"]] for r in payload["rows"]]
    targets = payload["targets"]
    return (table(["process", "reps", "cpu s (median)", "cpu s (max)", "wall s (median)",
                   "cpu / torch", "wall / torch"], rows)
            + f"\nbudget {targets['cpu_budget_s']} s of CPU and under "
              f"{targets['ratio_target']}x `import torch` (worst "
              f"{targets['worst_cpu_ratio']:.2f}x): {targets['verdict']}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--graphs", nargs="+", default=list(GRAPHS))
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    payload = run(args.graphs, args.reps, args.out)
    return 0 if payload["targets"]["verdict"] == "within budget" else 1


if __name__ == "__main__":
    sys.exit(main())
