"""Diagrams: an ExecutionPlan as a graphviz drawing, and a step's timeline as SVG.

`render_graph(plan, path)` draws what the compiler checked: one node per graph node,
its shape from its kind, its fill from its role, and on each edge the keys the
consumer reads from that producer (keys only passed along are summarised as "+N").
With `show_plan=True` the drawing adds the placement: each resource pool is a box
holding the nodes of its colocated roles, labelled with its devices; a function node
sits in the box of the pool whose workers run it (plan/sites.py), and only driver
nodes (sources, stateful functions) stay outside every pool. A folded role's nodes (served by a host
role's worker, e.g. the reference of a LoRA actor) sit in the host's box, dashed and
labelled "served by <host>".

An async plan (`trainer.staleness = k >= 1`, plan/async_split.py) holds BUFFER nodes, drawn
like any node (an orange queue shape labelled with its capacity, unit and admission
rule); its rollout-side nodes are outlined in blue (without `show_plan`, also boxed in
a "rollout side (runs k steps ahead)" cluster beside a "train side" one), and the
edges through a buffer drawn in orange, the one into it labelled "waits ≤k steps":
there a batch waits while training catches up.

A node the compiler removed because the algorithm does not need it (plan/unneeded.py,
e.g. the old log-probs when the update makes one optimizer step per batch) is drawn
dashed and grey, outside every pool, labelled "removed" with the reason, its edges
dotted: it does not run.

Timelines (`render_timeline`, `timeline_svg`) are drawn by draw/timeline.py.

Formats come from the file extension: .svg, .png, .pdf need Graphviz's `dot`
program; .dot writes the source and needs nothing.
"""
from __future__ import annotations

import html
import shutil
from pathlib import Path

import graphviz

from hybridflow.plan.async_split import sides_of
from hybridflow.plan.compiler import ExecutionPlan, PlanNode
from hybridflow.core.kinds import NodeKind, Op
from hybridflow.draw.style import (CROSSING_COLOR, DRIVER_FILL, FONT, ROLLOUT_SIDE_COLOR,
                                   RenderError, role_colors)
from hybridflow.draw.timeline import render_timeline, timeline_svg
from hybridflow.plan.sites import fn_site

__all__ = ["RenderError", "KIND_SHAPES", "role_colors", "edge_keys", "plan_to_dot",
           "render_graph", "render_timeline", "timeline_svg"]

FORMATS = ("svg", "png", "pdf", "dot")
# kind -> (graphviz shape, extra style); chosen to be told apart at a glance.
KIND_SHAPES = {
    NodeKind.SOURCE: ("cylinder", ""),
    NodeKind.GENERATE: ("hexagon", ""),
    NodeKind.INFERENCE: ("box", "rounded"),
    NodeKind.TRAIN: ("box3d", ""),
    NodeKind.FUNCTION: ("ellipse", ""),
    NodeKind.BUFFER: ("cds", ""),
}
MAX_SHOWN_KEYS = 6


# ----------------------------------------------------------------- shared pieces

def edge_keys(plan: ExecutionPlan, producer: str, consumer: str) -> tuple[list[str], list[str]]:
    """Keys flowing producer -> consumer: (keys the consumer reads, keys only passed on).

    A key travels along the edge when the producer's output carries it from the
    writer the consumer ends up using (the producer itself, or a node upstream of it
    when the producer forwards its input). A key that several inputs carry from one
    writer is drawn on the edge from that writer if it is an input, else on each."""
    node, src = plan.node(consumer), plan.node(producer)
    used = set(node.reads) | set(node.optional) | ({node.group_by} if node.group_by else set())
    read, passed = [], []
    for key, writer in node.input_keys.items():
        if src.output_keys.get(key) != writer:
            continue
        if writer != producer and writer in node.deps:
            continue  # drawn on the writer's own edge
        (read if key in used else passed).append(key)
    order = {k: i for i, k in enumerate(node.reads + node.optional)}
    read.sort(key=lambda k: order.get(k, len(order)))
    return read, passed


def _node_label(node: PlanNode, host: str | None = None) -> str:
    target = f"{node.role}.{node.method}" if node.op is Op.CALL else \
        getattr(node.fn, "__name__", "") if node.op is Op.FN else ""
    rows = [f'<B>{html.escape(node.name)}</B>']
    if target and target != node.name:
        rows.append(f'<FONT POINT-SIZE="10">{html.escape(target)}</FONT>')
    if host:
        rows.append(f'<FONT POINT-SIZE="9"><I>served by {html.escape(host)}</I></FONT>')
    if node.buffer is not None:
        for text in node.buffer.describe().split(", "):
            rows.append(f'<FONT POINT-SIZE="9">{html.escape(text)}</FONT>')
    extras = [f"{k}={v}" for k, v in node.kwargs.items()]
    if node.group_by:
        extras.append(f"group_by={node.group_by}")
    if extras:
        text = ", ".join(extras)
        text = text if len(text) <= 32 else text[:31] + "…"
        rows.append(f'<FONT POINT-SIZE="9" COLOR="#555555">{html.escape(text)}</FONT>')
    return "<" + "<BR/>".join(rows) + ">"


def _edge_label(read: list[str], passed: list[str], width: int = 30) -> str:
    """Read keys, comma-separated and wrapped to `width` characters, then "+N passed on"."""
    shown = read[:MAX_SHOWN_KEYS]
    words = [k + "," for k in shown[:-1]] + shown[-1:]
    if len(read) > len(shown):
        words[-1] += ","
        words.append(f"+{len(read) - len(shown)} more")
    lines, line = [], ""
    for word in words:
        if line and len(line) + 1 + len(word) > width:
            lines.append(line)
            line = word
        else:
            line = f"{line} {word}".strip()
    lines += [line] if line else []
    if passed:
        lines.append(f"+{len(passed)} passed on")
    return "\\l".join(lines) + "\\l" if lines else ""


def _node_attrs(node: PlanNode, colors: dict[str, str], host: str | None = None,
                ahead: bool = False) -> dict:
    """`host`: the role serving this node's role (folded), drawn dashed in its colour;
    `ahead`: a rollout-side node of an async plan, outlined in blue."""
    shape, style = KIND_SHAPES.get(node.kind, ("box", ""))
    styles = (style, "filled", "dashed" if host else "")
    attrs = {"shape": shape, "style": ",".join(s for s in styles if s),
             "fillcolor": colors.get(host or node.role, DRIVER_FILL),
             "label": _node_label(node, host), "tooltip": f"{node.kind} · {node.location}"}
    if ahead:
        attrs.update(color=ROLLOUT_SIDE_COLOR, penwidth="2.4")
    if node.op is Op.BUFFER:
        attrs.update(color=CROSSING_COLOR, penwidth="2.4")
    return attrs


def _steps(k: int) -> str:
    return f"{k} step" + ("s" if k != 1 else "")


def _pool_label(plan: ExecutionPlan, pool: str) -> str:
    spec = plan.placement.pools.get(pool)
    if spec is None:
        devices = "undefined"
    elif spec.nodes > 1:
        devices = f"{spec.nodes} nodes × {spec.devices_per_node} devices"
    else:
        devices = f"{spec.world_size} device" + ("s" if spec.world_size != 1 else "")
    roles = []
    for role in sorted(plan.placement.colocated().get(pool, [])):
        # the layout the role's workers build (a folded role's: its host's, or its own)
        layout = plan.placement.layout(role) if spec else None
        parts = [layout.describe()] if layout is not None and layout.sharded else []
        host = plan.placement.folded.get(role)
        if host is not None:
            parts.insert(0, f"served by {host}")
        if layout is not None and _generates_beside_sp(plan, role, host):
            parts.append(f"generates at {layout.without_sp().describe()}")
        roles.append(f"{role} ({', '.join(parts)})" if parts else role)
    return " · ".join([f"pool {pool}", devices] + ([", ".join(roles)] if roles else []))


def _generates_beside_sp(plan: ExecutionPlan, role: str, host: str | None) -> bool:
    """Whether `role` generates on a module that runs sequence-parallel elsewhere (its
    own, or its host's): generation never splits the sequence, so it runs at dp x tp."""
    sharing = host if host is not None else role
    if plan.placement.sp_size(sharing) <= 1:
        return False
    return any(n.kind is NodeKind.GENERATE and n.role == role for n in plan.nodes)


def _host_box(box, host: str, nodes: list[PlanNode], folded: dict[str, str],
              colors: dict[str, str], ahead: set[str]) -> None:
    """The host role's worker, holding its own nodes and those of the roles it serves."""
    guests = sorted(r for r, h in folded.items() if h == host)
    with box.subgraph(name=f"cluster_host_{host}") as inner:
        inner.attr(label=f"{host} worker · also serves {', '.join(guests)}",
                   style="rounded,dashed", color="#888888", fontsize="10", labeljust="l")
        for node in nodes:
            inner.node(node.name, **_node_attrs(node, colors, folded.get(node.role),
                                                node.name in ahead))


def _legend(dot: graphviz.Digraph, plan: ExecutionPlan, colors: dict[str, str]) -> None:
    """A boxed key in one row below the graph: the kinds used, the role colours, and
    for an async plan the rollout side's outline."""
    items = [(f"legend_kind_{k}", k, *KIND_SHAPES[k], DRIVER_FILL)
             for k in NodeKind if any(n.kind is k for n in plan.nodes)]
    items += [(f"legend_role_{r}", f"role {r}", "box", "", c) for r, c in colors.items()]
    items.append(("legend_role_driver", "driver", "box", "", DRIVER_FILL))
    outlined, sides = {}, sides_of(plan)
    if sides is not None:
        items.append(("legend_side_rollout", f"rollout side ({_steps(sides.staleness)} "
                      f"ahead)", "box", "", DRIVER_FILL))
        outlined = {"legend_side_rollout": {"color": ROLLOUT_SIDE_COLOR, "penwidth": "2.4"}}
    with dot.subgraph(name="cluster_legend") as leg:
        leg.attr(label="legend", style="dashed", color="#999999", fontsize="11",
                 fontcolor="#555555")
        leg.attr("node", fontsize="9", height="0.3", width="0.8", margin="0.05,0.03")
        with leg.subgraph() as row:
            row.attr(rank="same")
            for name, label, shape, style, fill in items:
                row.node(name, label, shape=shape, fillcolor=fill,
                         style=",".join(s for s in (style, "filled") if s),
                         **outlined.get(name, {}))
            for left, right in zip(items, items[1:]):
                row.edge(left[0], right[0], style="invis")
    sinks = [n.name for n in plan.nodes if not plan.consumers(n.name)]
    for sink in sinks:  # below the last rank of the graph
        dot.edge(sink, items[len(items) // 2][0], style="invis", weight="0")


# ----------------------------------------------------------------- graph diagram
def _side_boxes(dot: graphviz.Digraph, nodes: list[PlanNode], sides,
                colors: dict[str, str]) -> None:
    """An async plan without pools: a box for the rollout side, one for the train side."""
    boxes = (("rollout", f"rollout side (runs {_steps(sides.staleness)} ahead)",
              set(sides.rollout), ROLLOUT_SIDE_COLOR),
             ("train", "train side", set(sides.train), "#666666"))
    for key, label, members, color in boxes:
        with dot.subgraph(name=f"cluster_side_{key}") as box:
            box.attr(label=label, style="rounded,dashed", color=color, fontcolor=color,
                     fontsize="12", labeljust="l", penwidth="1.6")
            for node in nodes:
                if node.name in members:
                    box.node(node.name, **_node_attrs(node, colors, ahead=key == "rollout"))
    sided = set(sides.rollout) | set(sides.train)
    for node in nodes:  # the buffers, between the two boxes
        if node.name not in sided:
            dot.node(node.name, **_node_attrs(node, colors))


def _pool_boxes(dot: graphviz.Digraph, plan: ExecutionPlan, by_pool: dict,
                colors: dict[str, str], ahead: set[str]) -> None:
    """A box per resource pool; a host role's worker boxed within (folded roles)."""
    folded = plan.placement.folded
    for pool, nodes in by_pool.items():
        with dot.subgraph(name=f"cluster_pool_{pool}") as box:
            box.attr(label=_pool_label(plan, pool), style="rounded,filled",
                     fillcolor="#f4f4f4", color="#666666", fontsize="12", labeljust="l")
            hosted: dict[str, list[PlanNode]] = {}  # host role -> its and its guests' nodes
            for node in nodes:
                host = folded.get(node.role) or (node.role if node.role in
                                                 folded.values() else None)
                if host is None:
                    box.node(node.name, **_node_attrs(node, colors, ahead=node.name in ahead))
                else:
                    hosted.setdefault(host, []).append(node)
            for host, members in hosted.items():
                _host_box(box, host, members, folded, colors, ahead)


def _edges(dot: graphviz.Digraph, plan: ExecutionPlan) -> None:
    """An edge per dependency, labelled with the keys read; in an async plan the edges
    through a buffer are orange, the one into it saying how long its samples may wait;
    a weight change waiting for the generation of its pass (`after`) is dotted."""
    for node in plan.nodes:
        for dep in node.deps:
            read, passed = edge_keys(plan, dep, node.name)
            label, attrs = _edge_label(read, passed), {"style": "solid" if read else "dashed"}
            if node.op is Op.BUFFER:
                label = f"waits ≤{_steps(node.buffer.capacity)}\\l"
                attrs.update(color=CROSSING_COLOR, fontcolor=CROSSING_COLOR, penwidth="1.8",
                             style="solid")
            elif plan.node(dep).op is Op.BUFFER:
                attrs.update(color=CROSSING_COLOR, penwidth="1.8")
            dot.edge(dep, node.name, label=label, **attrs)
        for dep in node.after:
            dot.edge(dep, node.name, label="after\\l", style="dotted", color="#888888",
                     constraint="false")


REMOVED_COLOR = "#999999"


def _wrapped(text: str, width: int = 44) -> list[str]:
    lines, line = [], ""
    for word in text.split():
        if line and len(line) + 1 + len(word) > width:
            lines.append(line)
            line = word
        else:
            line = f"{line} {word}".strip()
    return lines + ([line] if line else [])


def _removed_nodes(dot: graphviz.Digraph, plan: ExecutionPlan) -> None:
    """The nodes the compiler removed (plan/unneeded.py): dashed, grey, with why."""
    present = {n.name for n in plan.nodes}
    for record in (r for r in plan.unneeded if r.removed):
        node = record.node
        rows = [f'<B>{html.escape(node.name)}</B>',
                f'<FONT POINT-SIZE="10">{html.escape(f"{node.role}.{node.method}")}</FONT>',
                '<FONT POINT-SIZE="9"><I>removed by the compiler</I></FONT>']
        rows += [f'<FONT POINT-SIZE="8">{html.escape(t)}</FONT>' for t in _wrapped(record.reason)]
        shape = KIND_SHAPES.get(node.kind, ("box", ""))
        dot.node(node.name, "<" + "<BR/>".join(rows) + ">", shape=shape[0],
                 style=",".join(s for s in (shape[1], "dashed", "filled") if s),
                 fillcolor="#eeeeee", color=REMOVED_COLOR, fontcolor="#777777",
                 tooltip=f"removed: {record.reason}")
        for dep in (d for d in node.deps if d in present):
            dot.edge(dep, node.name, style="dotted", color=REMOVED_COLOR)
        if record.consumer in present:
            dot.edge(node.name, record.consumer, label=f"{', '.join(record.keys)}: from "
                     f"its own forward\\l", style="dotted", color=REMOVED_COLOR,
                     fontcolor="#777777")


def plan_to_dot(plan: ExecutionPlan, show_plan: bool = False) -> graphviz.Digraph:
    """The diagram as a graphviz.Digraph (no `dot` program needed to build it)."""
    colors = role_colors(n.role for n in plan.nodes if n.role)
    sides = sides_of(plan)  # None unless trainer.staleness >= 1
    title = f"graph {plan.graph_name}" + (" · placement" if show_plan else "") + \
        (f" · async: trainer.staleness={sides.staleness}" if sides is not None else "")
    dot = graphviz.Digraph(plan.graph_name)
    dot.attr(rankdir="TB", fontname=FONT, nodesep="0.35", ranksep="0.55", label=title,
             labelloc="t", fontsize="16", newrank="true", compound="true")
    dot.attr("node", fontname=FONT, fontsize="12", margin="0.12,0.06", penwidth="1.2")
    dot.attr("edge", fontname=FONT, fontsize="9", fontcolor="#333333", color="#555555",
             arrowsize="0.7")
    ahead = set(sides.rollout) if sides is not None else set()
    by_pool: dict[str | None, list[PlanNode]] = {}
    for node in plan.nodes:  # a function node is drawn where it runs (plan/sites.py)
        pool = fn_site(plan, node).pool if node.op is Op.FN else node.pool
        by_pool.setdefault(pool if show_plan else None, []).append(node)
    outside = by_pool.pop(None, [])
    if sides is not None and not show_plan:
        _side_boxes(dot, outside, sides, colors)
    else:
        for node in outside:
            dot.node(node.name, **_node_attrs(node, colors, ahead=node.name in ahead))
    _pool_boxes(dot, plan, by_pool, colors, ahead)
    _removed_nodes(dot, plan)
    _edges(dot, plan)
    folded = plan.placement.folded if show_plan else {}
    _legend(dot, plan, {r: c for r, c in colors.items() if r not in folded})
    return dot


def _format_of(path: Path) -> str:
    fmt = path.suffix.lower().lstrip(".")
    if fmt not in FORMATS:
        raise RenderError(f"cannot render to '{path.name}': the extension must be one of "
                          f"{', '.join('.' + f for f in FORMATS)}")
    return fmt


def render_graph(plan: ExecutionPlan, path, show_plan: bool = False) -> Path:
    """Write the diagram of `plan` to `path`; the format comes from its extension."""
    path = Path(path)
    fmt = _format_of(path)
    dot = plan_to_dot(plan, show_plan)
    path.parent.mkdir(parents=True, exist_ok=True)
    if fmt == "dot":
        path.write_text(dot.source)
        return path
    if shutil.which("dot") is None:
        raise RenderError(f"rendering '{path.name}' needs Graphviz's `dot` program, which "
                          "is not installed: run `apt-get install graphviz` (Debian/Ubuntu) "
                          "or `brew install graphviz` (macOS), or write a .dot file instead")
    if fmt == "png":
        dot.attr(dpi="110")
    try:
        path.write_bytes(dot.pipe(format=fmt))
    except graphviz.ExecutableNotFound as err:
        raise RenderError(f"Graphviz's `dot` could not be run ({err}); run "
                          "`apt-get install graphviz`") from err
    except graphviz.CalledProcessError as err:
        raise RenderError(f"Graphviz failed to render '{path.name}': {err.stderr!r}") from err
    return path
