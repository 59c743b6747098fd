"""bench/async.py's ratios, verdicts, tables and printed report (its repetitions'
summaries or its JSON payload in, numbers and text out). Stateless."""
from __future__ import annotations

from bench.harness import median, table

TARGET_STEPS_PER_S = 1.6      # staleness 1 over staleness 0, at least (issue 15)
TARGET_TIME_TO_ACCURACY = 0.75  # staleness 1 over staleness 0, at most (issue 15)
TARGET_OF_BOUND = 0.95        # streaming at k = 2 over the placement's overlap bound (31)
TARGET_STREAMING_OVER_K1 = 1.1  # streaming at k = 2 over pipelined k = 1, at least (31)
TARGET_DRIVER_SHARE = 0.01    # driver bytes a step over the samples' bytes, at most (31)

__all__ = ["targets", "rep_table", "report", "ratios", "median_row", "variant_name",
           "TARGET_STEPS_PER_S", "TARGET_TIME_TO_ACCURACY", "TARGET_OF_BOUND",
           "TARGET_STREAMING_OVER_K1", "TARGET_DRIVER_SHARE"]

ROW_KEYS = ["step_s", "steps_per_s", "generate_s", "gen_pool_s", "main_pool_s",
            "response_length", "busy_main", "busy_gen", "busy_gen_s", "busy_main_s", "ahead",
            "cpu_share_gen", "cpu_share_main", "driver_cpu_s", "machine_parallelism",
            "driver_bytes", "sample_bytes", "staleness_mean", "staleness_max",
            "step_reached", "time_to_accuracy_s"]


def median_row(reps: list[dict], k) -> dict:
    """Variant `k`'s figures, each the median over the repetitions that have it."""
    row = {"staleness": k}
    for key in ROW_KEYS:
        values = [r[k][key] for r in reps if r[k].get(key) is not None]
        row[key] = median(values) if values else None
    return row


def overlap_bound(sync: dict) -> float | None:
    """The placement's overlap bound over the synchronous run (issue 31): its step over
    its busier side's seconds, 1 / max(busy gen, busy main)."""
    busiest = max(sync["busy_gen"] or 0.0, sync["busy_main"] or 0.0)
    return 1.0 / busiest if busiest else None


def ratios(reps: list[dict], k) -> dict:
    """k over staleness 0, per repetition, and their medians. `overlap_bound`: 1 / the
    synchronous run's busier side's busy fraction; `of_bound`: the speed-up as a
    fraction of it. `overlap_bound_nodes` (issue 15's): from the node timings, the
    synchronous step / (step - the lighter pool's seconds)."""
    speed = [r[k]["steps_per_s"] / r[0]["steps_per_s"] for r in reps]
    bound = [overlap_bound(r[0]) for r in reps]
    of_bound = [s / b for s, b in zip(speed, bound) if b]
    nodes = [r[0]["step_s"] / (r[0]["step_s"] - min(r[0]["gen_pool_s"], r[0]["main_pool_s"]))
             for r in reps]
    times = [r[k]["time_to_accuracy_s"] / r[0]["time_to_accuracy_s"] for r in reps
             if r[k]["time_to_accuracy_s"] and r[0]["time_to_accuracy_s"]]
    return {"steps_per_s": speed, "steps_per_s_median": median(speed),
            "overlap_bound": bound, "overlap_bound_median": median([b for b in bound if b]),
            "of_bound": of_bound, "of_bound_median": median(of_bound) if of_bound else None,
            "overlap_bound_nodes": nodes, "overlap_bound_nodes_median": median(nodes),
            "time_to_accuracy": times,
            "time_to_accuracy_median": median(times) if times else None,
            "time_to_accuracy_reached": f"{len(times)}/{len(reps)}"}


def variant_name(key) -> str:
    """'staleness 1', 'streaming 2', 'streaming 2 (generate only)' for 1, 's2', 's2g'."""
    key = str(key)
    if not key.startswith("s"):
        return f"staleness {key}"
    only = " (generate only)" if key.endswith("g") else ""
    return f"streaming {key[1:].rstrip('g')}{only}"


def _over(reps: list[dict], a: str, b: str) -> float | None:
    """Median over repetitions of variant a's steps/s over variant b's."""
    values = [r[a]["steps_per_s"] / r[b]["steps_per_s"] for r in reps if a in r and b in r]
    return median(values) if values else None


def _streaming_targets(p: dict) -> dict:
    """Streaming at k = 2 ("s2") against its placement's overlap bound and the one-step
    mode (issue 31), when the run has those variants."""
    out = {}
    for key, tail in (("s2", ""), ("s2g", "_generate_only")):
        s2 = p["ratios"].get(key)
        if not s2:
            continue
        of = s2["of_bound_median"]
        out[f"streaming_k2{tail}_of_overlap_bound"] = _verdict(
            of, f">= {TARGET_OF_BOUND}", of is not None and of >= TARGET_OF_BOUND)
        over = _over(p["reps"], key, "1")
        if over is not None:
            out[f"steps_per_s_streaming_k2{tail}_over_k1"] = _verdict(
                over, f">= {TARGET_STREAMING_OVER_K1}", over >= TARGET_STREAMING_OVER_K1)
    return out


def _driver_targets(p: dict) -> dict:
    """Each variant's driver bytes a step over the samples' bytes a step."""
    out = {}
    for row in p["rows"]:
        driver, samples = row.get("driver_bytes"), row.get("sample_bytes")
        if driver is None or not samples:
            continue
        share = driver / samples
        out[f"driver_bytes_share_{row['staleness']}"] = _verdict(
            share, f"<= {TARGET_DRIVER_SHARE}", share <= TARGET_DRIVER_SHARE)
    return out


def targets(p: dict) -> dict:
    one = p["ratios"].get("1")
    if not one:
        return {**_streaming_targets(p), **_driver_targets(p)}
    speed, tta = one["steps_per_s_median"], one["time_to_accuracy_median"]
    out = {"steps_per_s_k1": _verdict(speed, f">= {TARGET_STEPS_PER_S}",
                                      speed >= TARGET_STEPS_PER_S),
           "time_to_accuracy_k1": _verdict(tta, f"<= {TARGET_TIME_TO_ACCURACY}",
                                           tta is not None and tta <= TARGET_TIME_TO_ACCURACY)}
    fixed = (p.get("fixed_policy") or {}).get("ratios", {}).get("1")
    if fixed:
        speed = fixed["steps_per_s_median"]
        out["steps_per_s_k1_fixed_policy"] = _verdict(speed, f">= {TARGET_STEPS_PER_S}",
                                                      speed >= TARGET_STEPS_PER_S)
    return {**out, **_streaming_targets(p), **_driver_targets(p)}


def _verdict(value, target: str, met: bool) -> dict:
    return {"value": value, "target": target, "verdict": "met" if met else "missed"}


HEADERS = ["staleness", "step s", "steps/s", "gen pool s", "main pool s", "resp len",
           "busy gen", "busy main", "cpu/busy gen", "cpu/busy main", "driver cpu s", "cores free",
           "driver B", "samples B", "stale mean", "stale max", "0.9 at step", "0.9 after s"]


def _cells(r: dict) -> list:
    return [r["staleness"], r["step_s"], r["steps_per_s"], r["gen_pool_s"], r["main_pool_s"],
            r["response_length"], r["busy_gen"], r["busy_main"], r["cpu_share_gen"],
            r["cpu_share_main"], r["driver_cpu_s"], r.get("machine_parallelism"),
            r.get("driver_bytes"), r.get("sample_bytes"),
            r["staleness_mean"], r["staleness_max"], r["step_reached"], r["time_to_accuracy_s"]]


def _title(fixed: bool) -> str:
    return "fixed policy (actor.lr=0)" if fixed else "learning"


def rep_table(rep: dict[int, dict], index: int, fixed: bool = False) -> str:
    return (f"{_title(fixed)}, repetition {index + 1}:\n"
            + table(HEADERS, [_cells(r) for r in rep.values()]))


def phase_lines(ph: dict, fixed: bool, target_accuracy: float) -> list[str]:
    lines = [f"{_title(fixed)}: medians over repetitions",
             table(HEADERS, [_cells(r) for r in ph["rows"]])]
    for k, r in ph["ratios"].items():
        of = r.get("of_bound_median")
        line = (f"{variant_name(k)} / 0: steps/s {r['steps_per_s_median']:.2f}x "
                f"(per rep {[round(x, 2) for x in r['steps_per_s']]}; overlap bound "
                f"{r['overlap_bound_median']:.2f}x, "
                + (f"{of:.0%} of it" if of is not None else "-")
                + f"; issue 15's node-timing bound {r['overlap_bound_nodes_median']:.2f}x)")
        if not fixed:
            tta = r["time_to_accuracy_median"]
            line += (f", time to {target_accuracy}: "
                     + (f"{tta:.2f}x" if tta is not None else "-")
                     + f" (per rep {[round(x, 2) for x in r['time_to_accuracy']]}, "
                       f"both reached in {r['time_to_accuracy_reached']})")
        lines.append(line)
    for key in ("s2", "s2g"):
        over = _over(ph["reps"], key, "1")
        if over is not None:
            lines.append(f"{variant_name(key)} / staleness 1: steps/s {over:.2f}x")
    return lines


def report(p: dict) -> str:
    m = p["machine"]
    lines = [f"machine: {m['cpu']}, {m['cores']} cores, load {m['load_avg_1m_at_start']}",
             f"setup: {p['setup']}"]
    lines += phase_lines(p, False, p["setup"]["target_accuracy"])
    if p.get("fixed_policy"):
        lines += phase_lines(p["fixed_policy"], True, p["setup"]["target_accuracy"])
    for name, t in p["targets"].items():
        value = "-" if t["value"] is None else f"{t['value']:.3g}"
        lines.append(f"target {name}: {value} ({t['target']}): {t['verdict']}")
    lines.append(f"off-policy choice of the async runs: {p['setup']['off_policy']} "
                 f"({p['setup']['off_policy_override']}); wall {p['wall_s']:.0f} s")
    return "\n".join(lines)
