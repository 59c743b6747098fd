"""bench/async.py's verdicts, tables and printed report (its JSON payload in, text
out). Stateless."""
from __future__ import annotations

from bench.harness import table

TARGET_STEPS_PER_S = 1.6      # staleness 1 over staleness 0, at least
TARGET_TIME_TO_ACCURACY = 0.75  # staleness 1 over staleness 0, at most
TARGET_STREAMING = 1.55       # streaming at k = 2 over staleness 0, at least (issue 25)
TARGET_STREAMING_OVER_K1 = 1.1  # streaming at k = 2 over pipelined k = 1, at least

__all__ = ["targets", "rep_table", "report", "TARGET_STEPS_PER_S", "TARGET_TIME_TO_ACCURACY"]


def _streaming_targets(p: dict) -> dict:
    """Streaming at k = 2 ("s2") over synchronous, and over pipelined k = 1 (within each
    repetition, then the median), when the run has those variants."""
    s2 = p["ratios"].get("s2")
    if not s2:
        return {}
    speed = s2["steps_per_s_median"]
    out = {"steps_per_s_streaming_k2": _verdict(speed, f">= {TARGET_STREAMING}",
                                                speed >= TARGET_STREAMING)}
    over = sorted(r["s2"]["steps_per_s"] / r["1"]["steps_per_s"] for r in p["reps"]
                  if "1" in r and "s2" in r)
    if over:
        mid = over[len(over) // 2] if len(over) % 2 else \
            (over[len(over) // 2 - 1] + over[len(over) // 2]) / 2
        out["steps_per_s_streaming_k2_over_k1"] = _verdict(
            mid, f">= {TARGET_STREAMING_OVER_K1}", mid >= TARGET_STREAMING_OVER_K1)
    return out


def targets(p: dict) -> dict:
    one = p["ratios"].get("1")
    if not one:
        return _streaming_targets(p)
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
    return {**out, **_streaming_targets(p)}


def _verdict(value, target: str, met: bool) -> dict:
    return {"value": value, "target": target, "verdict": "met" if met else "missed"}


HEADERS = ["staleness", "step s", "steps/s", "gen pool s", "main pool s", "resp len",
           "busy gen", "busy main", "cpu/busy gen", "cpu/busy main", "driver cpu s", "cores free",
           "stale mean", "stale max", "0.9 at step", "0.9 after s"]


def _cells(r: dict) -> list:
    return [r["staleness"], r["step_s"], r["steps_per_s"], r["gen_pool_s"], r["main_pool_s"],
            r["response_length"], r["busy_gen"], r["busy_main"], r["cpu_share_gen"],
            r["cpu_share_main"], r["driver_cpu_s"], r.get("machine_parallelism"),
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
        line = (f"staleness {k} / 0: steps/s {r['steps_per_s_median']:.2f}x "
                f"(per rep {[round(x, 2) for x in r['steps_per_s']]}; overlap bound "
                f"{r['overlap_bound_median']:.2f}x)")
        if not fixed:
            tta = r["time_to_accuracy_median"]
            line += (f", time to {target_accuracy}: "
                     + (f"{tta:.2f}x" if tta is not None else "-")
                     + f" (per rep {[round(x, 2) for x in r['time_to_accuracy']]}, "
                       f"both reached in {r['time_to_accuracy_reached']})")
        lines.append(line)
    return lines


def report(p: dict) -> str:
    m = p["machine"]
    lines = [f"machine: {m['cpu']}, {m['cores']} cores, load {m['load_avg_1m_at_start']}",
             f"setup: {p['setup']}"]
    lines += phase_lines(p, False, p["setup"]["target_accuracy"])
    if p.get("fixed_policy"):
        lines += phase_lines(p["fixed_policy"], True, p["setup"]["target_accuracy"])
    for name, t in p["targets"].items():
        value = "-" if t["value"] is None else f"{t['value']:.2f}"
        lines.append(f"target {name}: {value} ({t['target']}): {t['verdict']}")
    lines.append(f"off-policy choice of the async runs: {p['setup']['off_policy']} "
                 f"({p['setup']['off_policy_override']}); wall {p['wall_s']:.0f} s")
    return "\n".join(lines)
