"""Words and JSON for a planner result: a ranked table, one paragraph, node times."""
from __future__ import annotations


from .devices import GIB
from .pipeline import seconds_text
from .ranking import Candidate, Ranking

IDLE_NOTE_FRACTION = 0.4  # mention a pool in a reason when it idles at least this much


def reason_lost(candidate: Candidate, best: Candidate) -> str:
    """Why `candidate` is slower than `best`, in one sentence with the numbers."""
    delta = candidate.step_seconds - best.step_seconds
    if delta <= 1e-9 * max(best.step_seconds, 1.0):
        return "ties with the best (same predicted step time); ranked after it by search order"
    pct = 100 * delta / best.step_seconds
    parts = [f"{delta:.1f} s (+{pct:.1f}%) slower than the best"]
    if candidate.pipeline is not None and best.pipeline is not None:
        parts.append(f"its {candidate.pipeline.kind} step is {candidate.pipeline.describe()}, "
                     f"the best's "
                     f"{best.pipeline.describe()}")
        return "; ".join(parts)
    mine, theirs = candidate.node_seconds, best.node_seconds
    worst_diff, worst = max(((mine[n] - theirs[n], n)
                             for n in candidate.critical_path if n in theirs),
                            default=(0.0, None))
    if worst is not None and worst_diff > 0.05 * delta:
        pool = candidate.timings[worst].pool
        devices = candidate.pool_of_name(pool).devices if pool else 0
        parts.append(f"{worst} takes {mine[worst]:.1f} s on {devices} device(s) "
                     f"vs {theirs[worst]:.1f} s")
    else:  # no node is slower: the loss is in running them one after another
        busiest = max(candidate.pools, key=lambda p: p.busy_seconds)
        parts.append(f"its nodes are no slower but run in sequence: pool {busiest.name} is busy "
                     f"{busiest.busy_seconds:.1f} s, while the best's busiest pool is busy "
                     f"{max(p.busy_seconds for p in best.pools):.1f} s "
                     "with its pools working concurrently")
        scaling = weakest_scaling(candidate, best)
        if scaling:
            parts.append(scaling)
    idle = idle_pools(candidate)
    if idle:
        parts.append("idle: " + ", ".join(idle))
    return "; ".join(parts)


def weakest_scaling(candidate: Candidate, best: Candidate) -> str:
    """The node that gains least from the candidate's extra devices, if any has more."""
    worst = None
    for name, seconds in candidate.node_seconds.items():
        mine, theirs = candidate.timings[name].pool, best.timings[name].pool
        if not mine or not theirs or seconds <= 0:
            continue
        more = candidate.pool_of_name(mine).devices / best.pool_of_name(theirs).devices
        speedup = best.node_seconds[name] / seconds
        if more > 1 and (worst is None or speedup / more < worst[0]):
            worst = (speedup / more, name, speedup, candidate.pool_of_name(mine).devices,
                     best.pool_of_name(theirs).devices)
    if worst is None:
        return ""
    _, name, speedup, many, few = worst
    return f"{name} is only {speedup:.2f}x faster on {many} devices than on {few}"


def idle_pools(candidate: Candidate) -> list[str]:
    out = []
    for pool in candidate.pools:
        idle = 1 - pool.busy_seconds / candidate.step_seconds if candidate.step_seconds else 0.0
        if len(candidate.pools) > 1 and idle >= IDLE_NOTE_FRACTION:
            out.append(f"pool {pool.name} ({pool.devices} dev) {100 * idle:.0f}% of the step")
    return out


def table(result: Ranking) -> str:
    rows = [("#", "pools [devices: role dp x tp]", "step s", "vs best", "peak GiB/dev")]
    best = result.best.step_seconds
    for rank, cand in enumerate(result.ranked, 1):
        peak = max(cand.pools, key=lambda p: p.memory.total)
        rows.append((str(rank), cand.label(), f"{cand.step_seconds:.1f}",
                     "best" if rank == 1 else f"+{100 * (cand.step_seconds / best - 1):.1f}%",
                     f"{peak.memory.total / GIB:.1f}/{peak.memory.capacity / GIB:.0f}"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows)


def node_table(candidate: Candidate) -> str:
    lines = ["node                  pool                      start s    end s   seconds"]
    for name, t in candidate.timings.items():
        lines.append(f"{name:<21} {t.pool or 'driver':<24} {t.start:8.1f} {t.end:8.1f} "
                     f"{t.seconds:9.2f}")
    return "\n".join(lines)


def paragraph(result: Ranking) -> str:
    best, cluster = result.best, result.cluster
    device = cluster.spec.label
    if best.colocated:
        pool = best.pools[0]
        where = (f"colocate {', '.join(pool.roles)} in one pool on all {pool.devices} {device} "
                 "devices")
    else:
        where = "split the roles into " + "; ".join(
            f"{'+'.join(p.roles)} on {p.devices}" for p in best.pools) + f" {device} devices"
    layouts = ", ".join(f"{r} dp={lay.dp} tp={lay.tp}" + (f" sp={lay.sp}" if lay.sp > 1 else "")
                        for p in best.pools for r, lay in p.layouts.items())
    text = [(f"Best plan: {where} ({layouts}); predicted step {best.step_seconds:.1f} s, "
             f"critical path {' -> '.join(best.critical_path)}.")]
    split = [f"{r} at sp={lay.sp}" for p in best.pools for r, lay in p.layouts.items()
             if lay.sp > 1]
    if split:
        text.append(f"Sequence parallelism: {', '.join(split)} splits each row of "
                    f"{result.workload.pass_seq_len:.0f} tokens over that many ranks, since "
                    "one row's activations do not fit a device at a smaller sp (generation "
                    "runs without sp).")
    gen = [f"{r} decodes {b} sequences at once per replica"
           for p in best.pools for r, b in p.decode_batch.items()]
    if gen:
        text.append(" ".join(gen).capitalize() + ".")
    shared = result.rollout_shared
    said_below = shared is not None and result.colocated is not None and \
        shared.label() == result.colocated.label()  # the async sentences compare it
    if result.colocated is not None and not best.colocated and not said_below:
        text.append(f"Colocating everything would take {result.colocated.step_seconds:.1f} s: "
                    f"{result.colocated.reason}.")
    elif result.colocated is None:
        text.append("Colocating everything does not fit in memory.")
    if result.pipeline is not None and result.pipeline.streaming:
        text += streaming_sentences(result)
    elif result.pipeline is not None:
        text += pipeline_sentences(result)
    if result.candidates:
        nxt = result.candidates[0]
        text.append(f"Runner-up {nxt.label()}: {nxt.reason}.")
    if result.driver_roles_text():
        text.append(result.driver_roles_text())
    text.append(f"{len(result.rejected)} role group(s) rejected for memory; search simulated "
                f"{result.plans_simulated} plans in {result.search_seconds:.2f} s.")
    return " ".join(text)


def pipeline_sentences(result: Ranking) -> list[str]:
    """The async step of the best plan, and why the rollout apart wins or loses against
    the rollout sharing the actor's devices, with the numbers."""
    best, terms = result.best, result.best.pipeline
    fixed = best.step_seconds - terms.overlapped - terms.sync
    text = [f"Async: a step takes {terms.describe()}, + {seconds_text(fixed)} s fixed = "
            f"{seconds_text(best.step_seconds)} s; the same plan synchronous would take "
            f"{seconds_text(terms.synchronous)} s."]
    generate = [n.name for n in result.nodes if n.kind.generates]
    apart, shared = result.rollout_apart, result.rollout_shared
    if apart is None or shared is None:
        return text + [_no_comparison(apart)]
    verdict = "beats" if apart.step_seconds < shared.step_seconds else "loses to"
    text.append(f"The rollout on a pool of its own ({apart.label()}, {apart.step_seconds:.1f} "
                f"s) {verdict} the rollout sharing the actor's devices ({shared.label()}, "
                f"{shared.step_seconds:.1f} s): sharing, {_sharing(shared, generate)}; apart, "
                f"{_apart(apart, generate)}.")
    return text


def _no_comparison(apart) -> str:
    """Why the rollout apart and shared are not compared: one of them was not searched."""
    if apart is None:
        return ("No plan with the rollout on a pool of its own fits on this cluster "
                "(or the groupings searched keep it with the actor).")
    return "Every plan searched has the rollout on a pool of its own."


def streaming_sentences(result: Ranking) -> list[str]:
    """The streaming step of the best plan (producer against consumer, which side is the
    bottleneck, each side's busy fraction) and how its devices split between the sides."""
    best, terms = result.best, result.best.pipeline
    text = [f"Streaming: a step takes {terms.describe()}; {_streaming_balance(terms)}; "
            "the same plan synchronous would take "
            f"{seconds_text(terms.synchronous)} s."]
    apart, shared = result.rollout_apart, result.rollout_shared
    if apart is None or shared is None:
        return text + [_no_comparison(apart)]
    verdict = "beats" if apart.step_seconds < shared.step_seconds else "loses to"
    gen, train = _split_devices(apart, result)
    # the best's balance is said above; another apart plan's is said here
    balance = ("" if apart.label() == best.label() else
               f"; {_streaming_balance(apart.pipeline)}")
    text.append(f"The rollout on a pool of its own ({gen} device(s) generating, {train} "
                f"training: {apart.label()}, {apart.step_seconds:.1f} s{balance}) {verdict} "
                f"the rollout sharing the actor's devices ({shared.label()}, "
                f"{shared.step_seconds:.1f} s, generation and training in turn).")
    return text


def _streaming_balance(terms) -> str:
    busy = terms.busy_fraction()
    fractions = ", ".join(f"{name} {100 * share:.0f}%" for name, share in busy.items())
    rate = (f"the rollout side generates {terms.rate():.3g} samples/s against a train side "
            f"that consumes a batch of {terms.samples} in {seconds_text(terms.consume)} s")
    if terms.inline:
        return f"{rate}, one after the other; busy: {fractions}"
    side = terms.bottleneck
    idle = {"rollout": "train side", "train": "rollout side"}[side]
    waits = f"the {idle} waits {100 * max(0.0, 1 - busy[idle]):.0f}% of the step"
    return f"{rate}; bottleneck: the {side} side ({waits}); busy: {fractions}"


def _split_devices(candidate: Candidate, result: Ranking) -> tuple[int, int]:
    """(devices of the pools that generate, devices of the others)."""
    generate = {n.name for n in candidate.graph_nodes or result.nodes
                if n.kind.generates}
    pools = {candidate.timings[n].pool for n in generate if n in candidate.timings}
    gen = sum(p.devices for p in candidate.pools if p.name in pools)
    return gen, sum(p.devices for p in candidate.pools) - gen


def _sharing(candidate: Candidate, generate: list[str]) -> str:
    pool = candidate.timings[generate[0]].pool if generate else None
    if pool is None:
        return f"the step is {candidate.pipeline.describe()}"
    gen = sum(candidate.node_seconds[n] for n in generate)
    busy = candidate.pipeline.pool_busy[pool]
    return (f"pool {pool} ({candidate.pool_of_name(pool).devices} dev) generates "
            f"({gen:.1f} s) and runs its other passes ({busy - gen:.1f} s) one after another, "
            f"busy {busy:.1f} s a step")


def _apart(candidate: Candidate, generate: list[str]) -> str:
    terms = candidate.pipeline
    gen = sum(candidate.node_seconds[n] for n in generate)
    pools = {candidate.timings[n].pool for n in generate}
    devices = sum(candidate.pool_of_name(p).devices for p in pools if p)
    others = ", ".join(f"pool {p} busy {s:.1f} s" for p, s in terms.pool_busy.items()
                       if p not in pools)
    return (f"generation takes {gen:.1f} s on {devices} dev while {others or 'nothing else'}"
            f" runs, then the weights sync in {terms.sync:.1f} s; set by {terms.bound_by}")


def explain(result: Ranking) -> str:
    head = (f"Placement of a {len(result.nodes)}-node graph on {result.cluster.describe()}; "
            f"workload {result.workload.describe()}; training {result.backend.describe()}; models "
            + ", ".join(f"{r}={m.name}" for r, m in result.models.items()))
    if result.pipeline is not None:
        head += f"; {result.pipeline.describe()}"
    parts = [head, "", table(result), "", paragraph(result), "", "Best plan, per node:",
             node_table(result.best)]
    if result.rejected:
        parts += ["", "Rejected (does not fit in memory):"]
        parts += [f"  - {s.reason(result.cluster.spec.label)}" for s in result.rejected[:8]]
    return "\n".join(parts)


def result_json(result: Ranking) -> dict:
    label = result.cluster.spec.label
    return {
        "cluster": {"nodes": result.cluster.nodes, "gpus_per_node": result.cluster.gpus_per_node,
                    "device": result.cluster.spec.name},
        "backend": vars(result.backend).copy(),
        "efficiency": result.cluster.spec.efficiency.to_json(),
        "workload": vars(result.workload).copy(),
        "models": {r: {"name": m.name, "params": m.params} for r, m in result.models.items()},
        "best": result.best.to_json(),
        "candidates": [c.to_json() for c in result.candidates],
        "colocated": result.colocated.to_json() if result.colocated else None,
        "rejected": [{"roles": list(s.roles), "devices": s.devices,
                      "need_gib": round(s.need / GIB, 2),
                      "usable_gib": round(s.usable / GIB, 2), "reason": s.reason(label)}
                     for s in result.rejected],
        "pipeline": None if result.pipeline is None else {
            "staleness": result.pipeline.staleness,
            "mode": result.pipeline.mode.value,
            "rollout_side": sorted(result.pipeline.rollout_side),
            "movable": dict(result.pipeline.movable)},
        "search_seconds": round(result.search_seconds, 4),
        "plans_simulated": result.plans_simulated,
    }
