"""Placement planner benchmark: best plan vs everything colocated, and search time.

For Llama 7B/13B/34B/70B as actor, critic, reference and reward model (PPO,
1024 prompts, 1024+1024 tokens, 8 mini-batches: the HybridFlow paper's workload) on 8..128
devices, prints the predicted step time of the planner's best plan, that of
the "everything colocated on all devices" plan (with its best layouts), their
ratio, and how long the search took; writes bench/results/planner.json.

    python bench/planner.py [--device a100-80g] [--out bench/results/planner.json]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from types import SimpleNamespace

REPO = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, REPO)

from hybridflow.planner import (Cluster, ModelSpec,  # noqa: E402 - after the path
                                NoFeasiblePlacement, Workload, plan_placement)

SIZES = ("7b", "13b", "34b", "70b")
DEVICE_COUNTS = (8, 16, 32, 64, 128)
ROLES = ("actor", "ref", "critic", "reward")
PAPER_WORKLOAD = Workload(prompts=1024, samples_per_prompt=1, prompt_len=1024, response_len=1024,
                          mini_batches=8)


def ppo_plan():
    """The compiled `graphs/ppo.py` itself (no workers start, no weights load)."""
    from hybridflow.program.assemble import load_plan
    from hybridflow.plan.weight_sync import planner_view
    return planner_view(load_plan(os.path.join(REPO, "graphs", "ppo.py")))


def machine() -> dict:
    cpu = platform.processor() or "unknown"
    try:
        with open("/proc/cpuinfo") as handle:
            cpu = next(line.split(":", 1)[1].strip() for line in handle
                       if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "python": platform.python_version(),
            "platform": platform.platform()}


def bench_one(graph, size: str, devices: int, device: str) -> dict:
    spec = ModelSpec.from_name(size)
    cluster = Cluster(max(1, devices // 8), min(devices, 8), device)
    began = time.perf_counter()
    try:
        result = plan_placement(graph, cluster, {r: spec for r in ROLES}, PAPER_WORKLOAD)
    except NoFeasiblePlacement as err:
        return {"model": size, "devices": devices, "fits": False,
                "search_seconds": time.perf_counter() - began,
                "reason": str(err).splitlines()[1].strip("- ")}
    colocated = result.colocated.step_seconds if result.colocated else None
    return {
        "model": size, "devices": devices, "fits": True,
        "best_step_seconds": round(result.best.step_seconds, 2),
        "colocated_step_seconds": round(colocated, 2) if colocated else None,
        "speedup_vs_colocated": (round(colocated / result.best.step_seconds, 3)
                                 if colocated else None),
        "best_plan": result.best.label(),
        "best_is_colocated": result.best.colocated,
        "search_seconds": round(result.search_seconds, 4),
        "plans_simulated": result.plans_simulated,
    }


def five_roles_search_seconds(plan, device: str) -> float:
    """The performance target: 5 roles on 128 devices (PPO plus a cost model scoring
    the rollout, as a fifth role)."""
    cost = SimpleNamespace(name="cost.score", kind="inference", role="cost",
                           deps=(plan.nodes[1].name,))
    graph = SimpleNamespace(nodes=[*plan.nodes[:2], cost, *plan.nodes[2:]])
    spec = ModelSpec.from_name("13b")
    result = plan_placement(graph, Cluster(16, 8, device), {r: spec for r in (*ROLES, "cost")},
                            PAPER_WORKLOAD)
    return result.search_seconds


def table(rows: list[dict]) -> str:
    lines = [f"{'model':<6}{'devices':>8}{'best s':>10}{'colocated s':>13}{'ratio':>8}"
             f"{'search s':>10}  best plan"]
    for r in rows:
        if not r["fits"]:
            lines.append(f"{r['model']:<6}{r['devices']:>8}{'-':>10}{'-':>13}{'-':>8}{r['search_seconds']:>10.3f}"
                         f"  does not fit: {r['reason'][:90]}")
            continue
        colo = f"{r['colocated_step_seconds']:.1f}" if r["colocated_step_seconds"] else "no fit"
        ratio = f"{r['speedup_vs_colocated']:.2f}x" if r["speedup_vs_colocated"] else "-"
        lines.append(f"{r['model']:<6}{r['devices']:>8}{r['best_step_seconds']:>10.1f}{colo:>13}{ratio:>8}"
                     f"{r['search_seconds']:>10.3f}  {r['best_plan']}")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="a100-80g")
    parser.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                      "results", "planner.json"))
    args = parser.parse_args()
    plan = ppo_plan()
    rows = [bench_one(plan, size, devices, args.device) for size in SIZES
            for devices in DEVICE_COUNTS]
    five = five_roles_search_seconds(plan, args.device)
    info = machine()
    print(f"machine: {info['cpu']}, {info['cores']} cores, Python {info['python']}")
    print(f"workload: PPO, roles {', '.join(ROLES)}, {PAPER_WORKLOAD.describe()}, "
          f"device {args.device}")
    print("ratio = colocated step / best step (colocated uses its own best rollout tp)\n")
    print(table(rows))
    print(f"\n5 roles (13B) on 128 devices: search {five:.3f} s")
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as handle:
        json.dump({"machine": info, "device": args.device, "workload": vars(PAPER_WORKLOAD),
                   "roles": list(ROLES), "rows": rows,
                   "five_roles_128_devices_search_seconds": round(five, 4)},
                  handle, indent=2)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
