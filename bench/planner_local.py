"""The planner on this machine: predicted vs measured seconds per node and per step.

1. Measure this machine (`hybridflow plan --measure-device`'s micro-benchmark)
   and predict each node of a measured run from the micro-benchmark alone.
2. Calibrate the device on that run (`--calibrate`), then predict a second run
   with a different workload from the calibrated entry: the honest test, since
   the second run was not fitted.
3. With `--async-run` (made by --make-runs with --runtime ray): an async run
   (Ray, the rollout on a pool of its own, trainer.staleness=1) predicted from the
   device calibrated on the (synchronous) fit run: the pipelined step of
   docs/placement.md "Async (staleness >= 1)" against the measured one.
Runs come from `hybridflow run graphs/grpo.py trainer.steps=6 trainer.val_every=0`
(and overrides); pass their directories, or let --make-runs start them. Each
node's median over the steps after the first counts.

    python bench/planner_local.py --fit-run RUN_A --check-run RUN_B [--async-run RUN_C]
    python bench/planner_local.py --make-runs      # runs both here first (about a minute)
    python bench/planner_local.py --make-runs --runtime ray      # and the async run

Writes bench/results/planner_local.json (planner_local_ray.json for Ray runs).
Targets: within +-30% per node and per step.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

REPO = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, REPO)

from hybridflow.planner.calibrate import calibrate, predict_run  # noqa: E402 - after the path
from hybridflow.planner.measure import device_from, measure  # noqa: E402
from hybridflow.program.run_dir import read_run  # noqa: E402

RUN_A = ["trainer.steps=6", "trainer.val_every=0"]  # 5 steps kept: medians resist a stall
RUN_B = ["trainer.steps=6", "trainer.val_every=0", "rollout.n=4", "data.batch_size=32",
         "rollout.max_new_tokens=6"]
RUN_ASYNC = RUN_A + ["placement.pools.gen.devices_per_node=1", "placement.roles.rollout=gen",
                     "trainer.staleness=1", "trainer.allow_uncorrected_async=true"]


def make_run(folder: str, name: str, overrides: list[str], runtime: str) -> str:
    graph = os.path.join(REPO, "graphs", "grpo.py")
    command = [sys.executable, "-m", "hybridflow.cli", "run", graph, "--runtime", runtime,
               *overrides,
               f"trainer.run_name={name}", f"trainer.runs_dir={folder}",
               "trainer.progress=false"]
    subprocess.run(command, check=True, cwd=folder, env={**os.environ, "PYTHONPATH": REPO})
    return os.path.join(folder, name)


def compare(run, prediction) -> dict:
    rows = {}
    for node, measured in run.node_seconds.items():
        predicted = prediction.node_seconds.get(node, 0.0)
        rows[node] = {"measured": round(measured, 4), "predicted": round(predicted, 4),
                      "ratio": round(predicted / measured, 3) if measured > 1e-3 else None}
    rows["step"] = {"measured": round(run.step_seconds, 4),
                    "predicted": round(prediction.step_seconds, 4),
                    "ratio": round(prediction.step_seconds / run.step_seconds, 3)}
    return rows


def table(title: str, rows: dict) -> str:
    lines = [title, f"{'node':<20}{'measured s':>12}{'predicted s':>13}{'pred/meas':>11}"]
    for node, r in rows.items():
        ratio = f"{r['ratio']:.2f}" if r["ratio"] else "-"
        lines.append(f"{node:<20}{r['measured']:>12.4f}{r['predicted']:>13.4f}{ratio:>11}")
    return "\n".join(lines)


def async_case(run, fitted, fit_run) -> dict:
    """The async run predicted from the entry calibrated on the synchronous fit run."""
    prediction = predict_run(run, fitted)
    rows = compare(run, prediction)
    print("\n" + table(f"calibrated on the fit run, predicting the async run {run.run_dir}:",
                       rows))
    terms = prediction.pipeline
    print(f"predicted pipelined step: {terms.describe()}; the same placement synchronous "
          f"{terms.synchronous:.4f} s; measured: async {run.step_seconds:.4f} s, "
          f"fit run (synchronous, colocated) {fit_run.step_seconds:.4f} s")
    return {"async_run": run.run_dir, "calibrated_on_async_run": rows,
            "async_predicted_terms": terms.to_json(),
            "fit_run_measured_step": round(fit_run.step_seconds, 4)}


def one_repeat(args, folder: str, index: int) -> dict:
    """Micro-benchmark, then the fit run, the check run (and the async run), back to back,
    so the micro-benchmark and the runs see the same load of the shared machine."""
    measured = measure(args.torch_threads)
    if args.make_runs:
        args.fit_run = make_run(folder, f"fit{index}", RUN_A, args.runtime)
        args.check_run = make_run(folder, f"check{index}", RUN_B, args.runtime)
        if args.runtime == "ray":
            args.async_run = make_run(folder, f"async{index}", RUN_ASYNC, args.runtime)
    device = device_from(measured, "this-machine")
    fit_run = read_run(args.fit_run)
    out = {"micro_benchmark": measured.to_json(), "fit_run": args.fit_run,
           "micro_benchmark_only": compare(fit_run, predict_run(fit_run, device))}
    print(table(f"micro-benchmark only, run {args.fit_run}:", out["micro_benchmark_only"]))
    fitted = calibrate(fit_run, device)
    out["calibrated_constants"] = fitted.efficiency.to_json()
    out["calibrated_on_fit_run"] = compare(fit_run, predict_run(fit_run, fitted))
    print("\n" + table("calibrated, same run (fit quality):", out["calibrated_on_fit_run"]))
    if args.check_run:
        check_run = read_run(args.check_run)
        out["check_run"] = args.check_run
        out["calibrated_on_check_run"] = compare(check_run, predict_run(check_run, fitted))
        print("\n" + table(f"calibrated on the fit run, predicting {args.check_run}:",
                           out["calibrated_on_check_run"]))
    if args.async_run:
        out.update(async_case(read_run(args.async_run), fitted, fit_run))
    return out


def spread(repeats: list[dict]) -> dict:
    """Per table and node: the median and range over repeats of measured seconds and of
    predicted / measured."""
    summary = {}
    for key in ("micro_benchmark_only", "calibrated_on_fit_run", "calibrated_on_check_run",
                "calibrated_on_async_run"):
        tables = [r[key] for r in repeats if key in r]
        if not tables:
            continue
        summary[key] = {}
        for node in tables[0]:
            measured = [t[node]["measured"] for t in tables if node in t]
            ratios = [t[node]["ratio"] for t in tables if node in t and t[node]["ratio"]]
            summary[key][node] = {"measured": _range(measured), "ratio": _range(ratios)}
    return summary


def _range(values: list[float]) -> dict | None:
    if not values:
        return None
    return {"median": round(statistics.median(values), 4), "min": round(min(values), 4),
            "max": round(max(values), 4), "n": len(values)}


def spread_table(title: str, rows: dict) -> str:
    lines = [title, f"{'node':<20}{'measured s median [min-max]':>30}"
                    f"{'pred/meas median [min-max]':>30}"]
    for node, r in rows.items():
        m, q = r["measured"], r["ratio"]
        meas = f"{m['median']:.4f} [{m['min']:.4f}-{m['max']:.4f}]" if m else "-"
        ratio = f"{q['median']:.2f} [{q['min']:.2f}-{q['max']:.2f}]" if q else "-"
        lines.append(f"{node:<20}{meas:>30}{ratio:>30}")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fit-run", help="run directory the device is calibrated on")
    parser.add_argument("--check-run", help="run directory predicted from the calibrated entry")
    parser.add_argument("--async-run", help="async run directory (Ray, rollout apart, "
                        "staleness 1) predicted from the calibrated entry")
    parser.add_argument("--make-runs", action="store_true", help="start both runs here first")
    parser.add_argument("--runtime", default="local", choices=("local", "ray"),
                        help="runtime of the runs --make-runs starts")
    parser.add_argument("--repeats", type=int, default=1,
                        help="with --make-runs: micro-benchmark and runs this many times, "
                        "alternated, and report the spread")
    parser.add_argument("--torch-threads", type=int, default=1,
                        help="threads of the micro-benchmark; with --make-runs also "
                        "OMP_NUM_THREADS of the runs (the local runtime runs roles in the "
                        "driver process, which otherwise uses every core)")
    parser.add_argument("--default-threads", action="store_true",
                        help="with --make-runs: leave the runs' OMP_NUM_THREADS unset")
    parser.add_argument("--out", help="default: bench/results/planner_local[_ray].json")
    args = parser.parse_args()
    suffix = "" if args.runtime == "local" else f"_{args.runtime}"
    args.out = args.out or os.path.join(os.path.dirname(os.path.abspath(__file__)), "results",
                                        f"planner_local{suffix}.json")
    if not args.make_runs and not args.fit_run:
        parser.error("give --fit-run RUN_DIR (and --check-run) or --make-runs")
    if args.make_runs and not args.default_threads:
        os.environ["OMP_NUM_THREADS"] = str(args.torch_threads)
    folder = tempfile.mkdtemp(prefix="planner-local-") if args.make_runs else ""
    repeats = [one_repeat(args, folder, i) for i in range(args.repeats if args.make_runs else 1)]
    out = dict(repeats[0])
    out["runs_omp_num_threads"] = os.environ.get("OMP_NUM_THREADS", "unset")
    out["load_average"] = os.getloadavg()
    if len(repeats) > 1:
        out["repeats"] = repeats
        out["spread"] = spread(repeats)
        for key, rows in out["spread"].items():
            print("\n" + spread_table(f"{key} over {len(repeats)} repeats:", rows))
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as handle:
        json.dump(out, handle, indent=2)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
