"""`hybridflow plan --measure-device` and `hybridflow plan --calibrate RUN_DIR`: device entries.

    hybridflow plan --measure-device --save mybox
    hybridflow plan --calibrate runs/grpo-1 --device mybox --save mybox-fit

Both print the entry (peaks and efficiency constants); `--save NAME` writes it
to ~/.hybridflow/devices/NAME.json (or the .json path given) for `--device`.
Calibration also prints the run's measured and predicted seconds per node,
before and after the fit.
"""
from __future__ import annotations

import json
import sys
from dataclasses import asdict

from hybridflow.core.printable import echo

__all__ = ["run_device"]


def run_device(args) -> int:
    from hybridflow.planner import PlanningError

    if args.save:  # checked before a measurement or a fit, never after it
        from hybridflow.core.files import check_output
        from hybridflow.planner.device_store import device_path
        check_output(device_path(args.save), "--save", "file",
                     inputs=[args.calibrate, args.device])
    try:
        if args.measure_device:
            device, provenance = _measured(args)
        else:
            device, provenance = _calibrated(args)
    except (PlanningError, ValueError, OSError) as err:
        echo(f"hybridflow plan: {err}", file=sys.stderr)
        return 2
    entry = asdict(device)
    entry["efficiency"] = device.efficiency.to_json()
    echo(json.dumps(entry, indent=2))
    if args.save:
        from hybridflow.planner.device_store import save_device
        path = save_device(device, args.save, provenance)
        echo(f"device entry written to {path}; use it with --device {args.save}",
             file=sys.stderr)
    return 0


def _measured(args):
    from hybridflow.planner.measure import device_from, measure

    name = _entry_name(args.save) or "this-machine"
    measured = measure(threads=args.threads)
    return device_from(measured, name), {"measured": measured.to_json()}


def _calibrated(args):
    import dataclasses

    from hybridflow.planner import PlanningError, get_device
    from hybridflow.planner.calibrate import calibrate, predict_run
    from hybridflow.program.run_dir import read_run

    if not args.device:  # a CPU run fitted to an A100's entry would be silently wrong
        raise PlanningError(f"--calibrate {args.calibrate} needs --device: the device the "
                            f"run ran on (cpu for a CPU run, a100-80g, h100-80g, ..., or an "
                            f"entry of `hybridflow plan --measure-device --save NAME`)")
    run = read_run(args.calibrate)
    start = get_device(args.device)
    fitted = calibrate(run, start)
    name = _entry_name(args.save) or f"{start.name}-calibrated"
    fitted = dataclasses.replace(fitted, name=name, label=f"{start.label}, calibrated")
    if start.cpu:  # fitted on this machine: its memory, not the generic CPU entry's 256 GiB
        from hybridflow.planner.measure import host_memory_bytes
        fitted = dataclasses.replace(fitted, memory_bytes=host_memory_bytes())
    before, after = predict_run(run, start), predict_run(run, fitted)
    echo(comparison_table(run, before, after), file=sys.stderr)
    rows = {n: {"measured": run.node_seconds[n], "before": before.node_seconds.get(n),
                "after": after.node_seconds.get(n)} for n in run.node_seconds}
    return fitted, {"calibrated_from": args.calibrate, "start_device": start.name,
                    "steps": list(run.steps), "nodes": rows,
                    "step": {"measured": run.step_seconds, "before": before.step_seconds,
                             "after": after.step_seconds}}


def _entry_name(save: str | None) -> str | None:
    if not save:
        return None
    import os
    return os.path.splitext(os.path.basename(save))[0]


def comparison_table(run, before, after) -> str:
    lines = [f"{'node':<22}{'measured s':>12}{'before s':>12}{'after s':>12}"]
    for node, measured in run.node_seconds.items():
        lines.append(f"{node:<22}{measured:>12.4f}{before.node_seconds.get(node, 0):>12.4f}"
                     f"{after.node_seconds.get(node, 0):>12.4f}")
    lines.append(f"{'step':<22}{run.step_seconds:>12.4f}{before.step_seconds:>12.4f}"
                 f"{after.step_seconds:>12.4f}")
    return "\n".join(lines)
