"""Diagrams: an ExecutionPlan as a graphviz drawing, and a step's timeline as SVG.

`render_graph(plan, path)` draws what the compiler checked: one node per graph node,
its shape from its kind, its fill from its role, and on each edge the keys the
consumer reads from that producer (keys only passed along are summarised as "+N").
With `show_plan=True` the drawing adds the placement: each resource pool is a box
holding the nodes of its colocated roles, labelled with its devices; driver nodes
(sources, functions) stay outside every pool. A folded role's nodes (served by a host
role's worker, e.g. the reference of a LoRA actor) sit in the host's box, dashed and
labelled "served by <host>".

`render_timeline(records, path)` draws one recorded step as a per-pool Gantt chart
in plain SVG (no `dot` needed), from the records the run loop writes to
`RUN_DIR/timeline.jsonl`: {"step", "node", "role", "pool", "start", "end"}.

Formats come from the file extension: .svg, .png, .pdf need Graphviz's `dot`
program; .dot writes the source and needs nothing.
"""
from __future__ import annotations

import html
import shutil
import zlib
from pathlib import Path

import graphviz

from hybridflow.compiler import ExecutionPlan, PlanNode
from hybridflow.kinds import NodeKind, Op

__all__ = ["RenderError", "KIND_SHAPES", "role_colors", "edge_keys", "plan_to_dot",
           "render_graph", "render_timeline", "timeline_svg"]

FORMATS = ("svg", "png", "pdf", "dot")
FONT = "Helvetica"
# kind -> (graphviz shape, extra style); chosen to be told apart at a glance.
KIND_SHAPES = {
    NodeKind.SOURCE: ("cylinder", ""),
    NodeKind.GENERATE: ("hexagon", ""),
    NodeKind.INFERENCE: ("box", "rounded"),
    NodeKind.TRAIN: ("box3d", ""),
    NodeKind.FUNCTION: ("ellipse", ""),
}
# Colour-blind-friendly pastels; a role keeps its colour from plan to plan.
PALETTE = ("#8dd3c7", "#ffffb3", "#bebada", "#fb8072", "#80b1d3", "#fdb462",
           "#b3de69", "#fccde5", "#bc80bd", "#ccebc5", "#ffed6f", "#d9d9d9")
DRIVER_FILL = "#ffffff"
MAX_SHOWN_KEYS = 6


class RenderError(RuntimeError):
    """A drawing that cannot be written; the message says what to install or change."""


# ----------------------------------------------------------------- shared pieces
def role_colors(roles) -> dict[str, str]:
    """role -> fill colour. Each role starts at a slot hashed from its name (so the
    actor is the same colour in every diagram) and moves on only on a collision."""
    colors: dict[str, str] = {}
    taken: set[int] = set()
    for role in sorted(set(roles)):
        slot = zlib.crc32(role.encode()) % len(PALETTE)
        for _ in range(len(PALETTE)):
            if slot not in taken:
                break
            slot = (slot + 1) % len(PALETTE)
        taken.add(slot)
        colors[role] = PALETTE[slot]
    return colors


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


def _node_attrs(node: PlanNode, colors: dict[str, str], host: str | None = None) -> dict:
    """`host`: the role serving this node's role (folded), drawn dashed in its colour."""
    shape, style = KIND_SHAPES.get(node.kind, ("box", ""))
    styles = (style, "filled", "dashed" if host else "")
    return {"shape": shape, "style": ",".join(s for s in styles if s),
            "fillcolor": colors.get(host or node.role, DRIVER_FILL),
            "label": _node_label(node, host), "tooltip": f"{node.kind} · {node.location}"}


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
        par = plan.placement.parallel.get(role, {})
        extra = " ".join(f"{k}={v}" for k, v in sorted(par.items()) if v != 1)
        if role in plan.placement.folded:
            extra = f"served by {plan.placement.folded[role]}"
        roles.append(f"{role} ({extra})" if extra else role)
    return " · ".join([f"pool {pool}", devices] + ([", ".join(roles)] if roles else []))


def _host_box(box, host: str, nodes: list[PlanNode], folded: dict[str, str],
              colors: dict[str, str]) -> None:
    """The host role's worker, holding its own nodes and those of the roles it serves."""
    guests = sorted(r for r, h in folded.items() if h == host)
    with box.subgraph(name=f"cluster_host_{host}") as inner:
        inner.attr(label=f"{host} worker · also serves {', '.join(guests)}",
                   style="rounded,dashed", color="#888888", fontsize="10", labeljust="l")
        for node in nodes:
            inner.node(node.name, **_node_attrs(node, colors, folded.get(node.role)))


def _legend(dot: graphviz.Digraph, plan: ExecutionPlan, colors: dict[str, str]) -> None:
    """A boxed key in one row below the graph: the kinds used, then the role colours."""
    items = [(f"legend_kind_{k}", k, *KIND_SHAPES[k], DRIVER_FILL)
             for k in NodeKind if any(n.kind is k for n in plan.nodes)]
    items += [(f"legend_role_{r}", f"role {r}", "box", "", c) for r, c in colors.items()]
    items.append(("legend_role_driver", "driver", "box", "", DRIVER_FILL))
    with dot.subgraph(name="cluster_legend") as leg:
        leg.attr(label="legend", style="dashed", color="#999999", fontsize="11",
                 fontcolor="#555555")
        leg.attr("node", fontsize="9", height="0.3", width="0.8", margin="0.05,0.03")
        with leg.subgraph() as row:
            row.attr(rank="same")
            for name, label, shape, style, fill in items:
                row.node(name, label, shape=shape, fillcolor=fill,
                         style=",".join(s for s in (style, "filled") if s))
            for left, right in zip(items, items[1:]):
                row.edge(left[0], right[0], style="invis")
    sinks = [n.name for n in plan.nodes if not plan.consumers(n.name)]
    for sink in sinks:  # below the last rank of the graph
        dot.edge(sink, items[len(items) // 2][0], style="invis", weight="0")


# ----------------------------------------------------------------- graph diagram
def plan_to_dot(plan: ExecutionPlan, show_plan: bool = False) -> graphviz.Digraph:
    """The diagram as a graphviz.Digraph (no `dot` program needed to build it)."""
    colors = role_colors(n.role for n in plan.nodes if n.role)
    dot = graphviz.Digraph(plan.graph_name)
    dot.attr(rankdir="TB", fontname=FONT, nodesep="0.35", ranksep="0.55",
             label=f"graph {plan.graph_name}" + (" · placement" if show_plan else ""),
             labelloc="t", fontsize="16", newrank="true", compound="true")
    dot.attr("node", fontname=FONT, fontsize="12", margin="0.12,0.06", penwidth="1.2")
    dot.attr("edge", fontname=FONT, fontsize="9", fontcolor="#333333", color="#555555",
             arrowsize="0.7")
    by_pool: dict[str | None, list[PlanNode]] = {}
    for node in plan.nodes:
        by_pool.setdefault(node.pool if show_plan else None, []).append(node)
    folded = plan.placement.folded if show_plan else {}
    for node in by_pool.pop(None, []):
        dot.node(node.name, **_node_attrs(node, colors))
    for pool, nodes in by_pool.items():
        with dot.subgraph(name=f"cluster_pool_{pool}") as box:
            box.attr(label=_pool_label(plan, pool), style="rounded,filled",
                     fillcolor="#f4f4f4", color="#666666", fontsize="12", labeljust="l")
            hosted: dict[str, list[PlanNode]] = {}  # host role -> its and its guests' nodes
            for node in nodes:
                host = folded.get(node.role) or (node.role if node.role in
                                                 folded.values() else None)
                if host is None:
                    box.node(node.name, **_node_attrs(node, colors))
                else:
                    hosted.setdefault(host, []).append(node)
            for host, members in hosted.items():
                _host_box(box, host, members, folded, colors)
    for node in plan.nodes:
        for dep in node.deps:
            read, passed = edge_keys(plan, dep, node.name)
            style = "solid" if read else "dashed"
            dot.edge(dep, node.name, label=_edge_label(read, passed), style=style)
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


# ----------------------------------------------------------------- timeline
LANE_HEIGHT, RIGHT, TOP, WIDTH, CHAR_WIDTH = 26, 20, 48, 1000, 6.6  # px; CHAR_WIDTH at 11px


def _lanes(bars: list[dict]) -> list[int]:
    """Lane index of each bar (sorted by start) so that bars in one lane never overlap."""
    ends: list[float] = []
    lanes = []
    for bar in bars:
        for i, end in enumerate(ends):
            if bar["start"] >= end - 1e-9:
                ends[i] = bar["end"]
                lanes.append(i)
                break
        else:
            ends.append(bar["end"])
            lanes.append(len(ends) - 1)
    return lanes


def _bar_svg(bar: dict, x: float, w: float, y: float, room: float, fill: str, uid: int) -> str:
    """A bar with its node name inside when it fits, else just right of it when the lane
    is free there (`room` px), else clipped to the bar (the tooltip has it in full)."""
    name = html.escape(str(bar["node"]))
    secs = bar["end"] - bar["start"]
    width = len(str(bar["node"])) * CHAR_WIDTH + 6
    clip = ""
    if width <= w:
        tx = x + 3
    elif width <= room - w:
        tx = x + w + 3
    else:
        tx = x + 3
        clip = f' clip-path="url(#bar{uid})"'
    return (f'<g class="bar"><title>{name} · {html.escape(str(bar.get("role") or "driver"))} · '
            f'{secs:.3f}s</title><clipPath id="bar{uid}"><rect x="{x:.1f}" y="{y}" '
            f'width="{w:.1f}" height="{LANE_HEIGHT - 4}"/></clipPath><rect x="{x:.1f}" '
            f'y="{y}" width="{w:.1f}" height="{LANE_HEIGHT - 4}" rx="3" fill="{fill}" '
            f'stroke="#444444"/><text x="{tx:.1f}" y="{y + 15}" font-size="11"{clip}>{name}'
            f'</text></g>')


def timeline_svg(records: list[dict], step: int | None = None) -> str:
    """SVG text of one step's Gantt chart: a row per pool (None: driver), a bar per node."""
    if not records:
        raise RenderError("the timeline has no records: was the run started with the "
                          "step loop that writes RUN_DIR/timeline.jsonl?")
    steps = sorted({r.get("step", 0) for r in records})
    step = steps[-1] if step is None else step
    rows = [r for r in records if r.get("step", 0) == step]
    if not rows:
        raise RenderError(f"no records for step {step}; recorded steps: {steps}")
    pools = sorted({r.get("pool") for r in rows}, key=lambda p: (p is None, str(p)))
    names = {p: "driver" if p is None else f"pool {p}" for p in pools}
    left = 16 + max(len(n) for n in names.values()) * 7.5
    t0 = min(r["start"] for r in rows)
    span = max(max(r["end"] for r in rows) - t0, 1e-6)
    scale = (WIDTH - left - RIGHT) / span
    colors = role_colors(r["role"] for r in rows if r.get("role"))
    out, y = [], TOP
    for pool in pools:
        bars = sorted((r for r in rows if r.get("pool") == pool), key=lambda r: r["start"])
        lanes = _lanes(bars)
        height = (max(lanes) + 1) * LANE_HEIGHT + 8
        out.append(f'<g class="row" data-pool="{html.escape(names[pool])}">'
                   f'<rect x="0" y="{y}" width="{WIDTH}" height="{height}" fill="#eeeeee" '
                   f'fill-opacity="0.5" stroke="#dddddd"/>'
                   f'<text x="8" y="{y + 18}" font-weight="bold">'
                   f'{html.escape(names[pool])}</text>')
        for i, (bar, lane) in enumerate(zip(bars, lanes)):
            x = left + (bar["start"] - t0) * scale
            w = max((bar["end"] - bar["start"]) * scale, 2)
            later = [b["start"] for b, other in zip(bars[i + 1:], lanes[i + 1:]) if other == lane]
            room = (min(later, default=t0 + span) - bar["start"]) * scale + RIGHT
            out.append(_bar_svg(bar, x, w, y + 4 + lane * LANE_HEIGHT, room,
                                colors.get(bar.get("role"), "#ffffff"), len(out)))
        out.append("</g>")
        y += height + 4
    ticks = []
    for i in range(6):
        t = span * i / 5
        x = left + t * scale
        ticks.append(f'<line x1="{x:.1f}" y1="{TOP - 6}" x2="{x:.1f}" y2="{y}" '
                     f'stroke="#cccccc" stroke-dasharray="3,3"/><text x="{x:.1f}" '
                     f'y="{TOP - 10}" font-size="10" text-anchor="middle">{t:.2f}s</text>')
    title = f"step {step} · {span:.2f}s · {len(rows)} node runs"
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{y + 10}" '
            f'font-family="{FONT}, sans-serif" font-size="12">'
            f'<rect width="100%" height="100%" fill="white"/>'
            f'<text x="8" y="18" font-size="14" font-weight="bold">{html.escape(title)}</text>'
            + "".join(ticks) + "".join(out) + "</svg>\n")


def render_timeline(records: list[dict], path, step: int | None = None) -> Path:
    """Write one step (default: the last recorded) of `records` as an SVG Gantt chart."""
    path = Path(path)
    if path.suffix.lower() != ".svg":
        raise RenderError(f"timelines are written as SVG: use a .svg path, not '{path.name}'")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(timeline_svg(records, step))
    return path
