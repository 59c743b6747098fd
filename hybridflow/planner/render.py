"""Draw a plan: pools as clusters, roles inside with their devices and (dp, tp), nodes with times.

Driver nodes (sources, functions, rule roles) sit in their own cluster. Edges
follow the graph's dependencies; edges on the critical path are bold and red.
"""
from __future__ import annotations

import os
import shutil

import graphviz

from hybridflow.core.kinds import NodeKind

from .devices import GIB
from .ranking import Candidate, Ranking

FORMATS = ("svg", "png", "pdf")
POOL_COLOURS = ("#e8f0fe", "#e6f4ea", "#fef7e0", "#fce8e6", "#f3e8fd", "#e0f7fa")


class RenderError(RuntimeError):
    pass


def plan_to_dot(result: Ranking, rank: int = 0) -> graphviz.Digraph:
    candidate = result.ranked[rank]
    dot = graphviz.Digraph("plan", graph_attr={
        "rankdir": "TB", "fontname": "Helvetica", "fontsize": "14", "labelloc": "t",
        "compound": "true",
        "label": _title(result, candidate), "newrank": "true"})
    dot.attr("node", shape="box", style="rounded,filled", fillcolor="white", fontname="Helvetica",
             fontsize="11")
    dot.attr("edge", color="#5f6368")
    for i in range(len(candidate.pools)):
        _pool_cluster(dot, result, candidate, i)
    _driver_cluster(dot, result, candidate)
    on_path = set(zip(candidate.critical_path, candidate.critical_path[1:]))
    for node in candidate.graph_nodes or result.nodes:
        for dep in node.deps:
            attrs = {"color": "#d93025", "penwidth": "2.2"} if (dep, node.name) in on_path else {}
            dot.edge(dep, node.name, **attrs)
    return dot


def _title(result: Ranking, candidate: Candidate) -> str:
    kind = "colocated" if candidate.colocated else f"{len(candidate.pools)} pools"
    if candidate.pipeline is not None:  # the step overlaps the two sides
        mode = " streaming" if candidate.pipeline.mode.streams else ""
        kind += f", async{mode} staleness {candidate.pipeline.staleness}"
    return (f"{kind}: predicted step {candidate.step_seconds:.1f} s "
            f"on {result.cluster.describe()}\n"
            f"{result.workload.describe()}  (red: critical path)")


def _pool_cluster(dot: graphviz.Digraph, result: Ranking, candidate: Candidate, index: int) -> None:
    pool = candidate.pools[index]
    mem = pool.memory
    label = (f"pool {pool.name}: {pool.nodes} node(s) x {pool.devices_per_node} "
             f"{result.cluster.spec.label}\n"
             f"peak {mem.total / GIB:.1f} of {mem.capacity / GIB:.0f} GiB per device, "
             f"busy {pool.busy_seconds:.1f} s")
    with dot.subgraph(name=f"cluster_pool_{index}") as sub:
        sub.attr(label=label, style="filled", fillcolor=POOL_COLOURS[index % len(POOL_COLOURS)],
                 color="#9aa0a6", fontsize="12")
        training = _training(result)
        for role in pool.roles:
            layout = pool.layouts[role]
            batch = pool.decode_batch.get(role)
            extra = f", decode batch {batch}" if batch else ""
            split = f", sp={layout.sp}" if layout.sp > 1 else ""
            if batch:  # a generating role: its layout is the rollout's (never split by sp)
                where = (f"rollout dp={pool.devices // layout.tp} x tp={layout.tp}, {training}"
                         f"{split} over {pool.devices} devices")
            else:
                where = (f"dp={layout.dp} tp={layout.tp}{split} ({training} over "
                         f"{pool.devices} devices)")
            role_label = f"{role}: {where}\n{mem.static[role] / GIB:.1f} GiB resident{extra}"
            with sub.subgraph(name=f"cluster_role_{role}") as box:
                box.attr(label=role_label, style="rounded,filled", fillcolor="white",
                         color="#bdc1c6",
                         fontsize="11")
                for node in candidate.graph_nodes or result.nodes:
                    if node.role == role:
                        box.node(node.name,
                                 f"{node.name}\n{candidate.timings[node.name].seconds:.1f} s")


def _training(result: Ranking) -> str:
    """How the pool's passes run, as the drawing names it."""
    backend = result.backend
    if backend.model_parallel:
        return f"Megatron tp{backend.tp} pp{backend.pp}"
    return "FSDP" if backend.offload == "none" else f"FSDP, offload {backend.offload}"


def _driver_cluster(dot: graphviz.Digraph, result: Ranking, candidate: Candidate) -> None:
    with dot.subgraph(name="cluster_driver") as sub:
        sub.attr(label="driver (no device)", style="dashed", color="#9aa0a6", fontsize="12")
        for node in candidate.graph_nodes or result.nodes:
            if candidate.timings[node.name].pool is None:
                shape = "ellipse" if node.kind == NodeKind.SOURCE else "box"
                kind = "rule function" if node.role else node.kind
                sub.node(node.name, f"{node.name}\n{kind}", shape=shape, fillcolor="#f1f3f4")


def render_plan(result: Ranking, path: str, rank: int = 0) -> str:
    """Write the drawing to `path` (.svg, .png, .pdf, or .dot/.gv for the source); returns the
    path."""
    dot = plan_to_dot(result, rank)
    stem, ext = os.path.splitext(path)
    fmt = ext.lstrip(".").lower()
    if fmt in ("dot", "gv"):
        with open(path, "w") as handle:
            handle.write(dot.source)
        return path
    if fmt not in FORMATS:
        raise RenderError(f"cannot render to {path!r}: use one of .svg, .png, .pdf, .dot")
    if shutil.which("dot") is None:
        raise RenderError("graphviz's `dot` program is not installed (apt-get install graphviz); "
                          "or render to a .dot file")
    dot.render(stem, format=fmt, cleanup=True)
    return path
