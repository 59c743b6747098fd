"""bench/async.py's verdicts, tables and printed report (its JSON payload in, text
out). Stateless."""
from __future__ import annotations

from bench.harness import table

TARGET_STEPS_PER_S = 1.6      # staleness 1 over staleness 0, at least
TARGET_TIME_TO_ACCURACY = 0.75  # staleness 1 over staleness 0, at most

__all__ = ["targets", "rep_table", "report", "TARGET_STEPS_PER_S", "TARGET_TIME_TO_ACCURACY"]


def targets(p: dict) -> dict:
    one = p["ratios"].get("1")
    if not one:
        return {}
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
    return out


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
