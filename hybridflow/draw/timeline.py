"""Recorded steps of a run as a per-pool Gantt chart, in plain SVG (no `dot` needed).

The records are those the run loop writes to `RUN_DIR/timeline.jsonl`: {"step",
"node", "role", "pool", "rank", "start", "end", "origin"}, times in seconds from the
step's first record, whose wall-clock time is `origin` (runs before it lack it). The
chart draws one step, or several consecutive steps laid end to end (`steps=(3, 5)`):
the time between two steps (metrics, checkpoints) is not recorded, so each step starts
a small gap after the previous one ends, at a dashed line.

An async run (`trainer.staleness = k >= 1`, plan/async_split.py) records in step t the
train side of step t and the rollout side generating the batch of step t + k (in its
first step also the warm-up batches t .. t + k - 1). Given the run's sides
(`TimelineSides`) the chart outlines rollout-side bars in dashed blue and names the
step whose batch each generates. Which batch is read from the calls: each scheduler
call that generates starts with the rollout side's source node, the calls of one
step generate consecutive batches, and the last is that of step t + k (or of the
run's last step when t + k is past it).

A streaming run (`trainer.async_mode=streaming`, `TimelineSides.streaming`) has no
barrier between its steps: the chart lays every record of the chosen steps on one
continuous time axis (each record's `origin`, the wall-clock time of its step's first
record, plus its own seconds), no step lines. The stream side's records
(runtime/run_long/stream_record.py: the engine's work between two polls, or an inline poll's
decode steps, with their counts) are outlined in dashed blue and named with the decode
steps and rows; each train-side bar names its step. The blank between two steps' records
is not recorded (the stream side's records start with their step).

Stateless.
"""
from __future__ import annotations

import html
from bisect import bisect_right
from dataclasses import dataclass
from pathlib import Path

from hybridflow.draw.style import FONT, ROLLOUT_SIDE_COLOR, RenderError, role_colors

__all__ = ["TimelineSides", "batch_steps", "timeline_svg", "render_timeline"]

LANE_HEIGHT, RIGHT, CHAR_WIDTH = 26, 20, 6.6  # px; CHAR_WIDTH at 11px
WIDTH, WIDTH_PER_EXTRA_STEP, MAX_WIDTH = 1000, 400, 2600
STEP_GAP = 0.02  # of the drawn steps' total time, between two steps


@dataclass(frozen=True)
class TimelineSides:
    """What the chart needs of an async run's plan (its `async_split.Sides`)."""
    rollout: frozenset            # names of the rollout-side nodes
    staleness: int
    source: str | None = None     # the rollout side's source node; None: no batch labels
    last_step: int | None = None  # trainer.steps: no batch is generated past it
    streaming: bool = False       # trainer.async_mode=streaming: one continuous axis


def batch_steps(rows: list[dict], step: int, sides: TimelineSides) -> list[int | None]:
    """For each record of step `step`, the step whose batch its node works on: `step`
    on the train side; on the rollout side, the batch of the call it ran in (None when
    the calls cannot be told apart)."""
    calls = sorted(r["start"] for r in rows if r["node"] == sides.source)
    last = step + sides.staleness
    if sides.last_step is not None:
        last = min(last, sides.last_step)
    out: list[int | None] = []
    for row in rows:
        if row["node"] not in sides.rollout:
            out.append(step)
        elif calls:
            call = max(bisect_right(calls, row["start"] + 1e-9) - 1, 0)
            out.append(last - len(calls) + 1 + call)
        else:
            out.append(None)
    return out


def _chosen_steps(records: list[dict], step: int | None,
                  steps: tuple[int, int] | None) -> list[int]:
    recorded = sorted({r.get("step", 0) for r in records})
    if steps is not None:
        chosen = [s for s in recorded if steps[0] <= s <= steps[1]]
        if not chosen:
            raise RenderError(f"no records for steps {steps[0]}-{steps[1]}; recorded "
                              f"steps: {recorded}")
        return chosen
    step = recorded[-1] if step is None else step
    if step not in recorded:
        raise RenderError(f"no records for step {step}; recorded steps: {recorded}")
    return [step]


def _laid_out(records: list[dict], chosen: list[int],
              sides: TimelineSides | None) -> tuple[list[dict], list[tuple[int, float]], float]:
    """(bars on one time axis, (step, its start) for each step, the axis' length)."""
    by_step = {s: [r for r in records if r.get("step", 0) == s] for s in chosen}
    spans = {s: max(r["end"] for r in rows) - min(r["start"] for r in rows)
             for s, rows in by_step.items()}
    gap = STEP_GAP * sum(spans.values()) if len(chosen) > 1 else 0.0
    bars, starts, t = [], [], 0.0
    for s, rows in by_step.items():
        t0 = min(r["start"] for r in rows)
        batches = batch_steps(rows, s, sides) if sides else [None] * len(rows)
        for row, batch in zip(rows, batches):
            bars.append({**row, "start": t + row["start"] - t0, "end": t + row["end"] - t0,
                         "batch": batch, "ahead": bool(sides) and row["node"] in sides.rollout})
        starts.append((s, t))
        t += spans[s] + gap
    return bars, starts, max(t - gap, 1e-6)


def _laid_continuous(records: list[dict], chosen: list[int],
                     sides: TimelineSides) -> tuple[list[dict], list[tuple[int, float]], float]:
    """A streaming run's bars on one wall-clock axis from the chosen steps' first record;
    (bars, (step, its first record) for each step, the axis' length)."""
    rows = [r for r in records if r.get("step", 0) in chosen]
    t0 = min(r["origin"] + r["start"] for r in rows)
    bars = [{**r, "start": r["origin"] + r["start"] - t0, "end": r["origin"] + r["end"] - t0,
             "batch": None, "ahead": r["node"] in sides.rollout} for r in rows]
    starts = [(s, min(b["start"] for b in bars if b.get("step", 0) == s)) for s in chosen]
    return bars, starts, max(max(b["end"] for b in bars), 1e-6)


def _continuous(records: list[dict], chosen: list[int], sides: TimelineSides | None) -> bool:
    """Whether to draw on one axis: a streaming run whose records carry their origin."""
    return bool(sides and sides.streaming) and all(
        "origin" in r for r in records if r.get("step", 0) in chosen)


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


def _bar_text(bar: dict) -> str:
    # the stream side's work between polls (runtime/run_long/stream_record.py)
    if bar.get("stream"):
        return (f"{bar['node']}: {bar.get('decode_steps', 0)} decode steps, "
                f"{bar.get('rows', 0)} rows done")
    if bar.get("streamed"):  # a train-side bar of a streaming run: its step
        return f"{bar['node']} (step {bar.get('step', 0)})"
    if bar["ahead"] and bar["batch"] is not None:
        return f"{bar['node']} (step {bar['batch']})"
    return str(bar["node"])


def _bar_svg(bar: dict, x: float, w: float, y: float, room: float, fill: str, uid: int) -> str:
    """A bar with its label inside when it fits, else just right of it when the lane
    is free there (`room` px), else clipped to the bar (the tooltip has it in full).
    Rollout-side bars of an async run are outlined in dashed blue."""
    text = _bar_text(bar)
    label, secs = html.escape(text), bar["end"] - bar["start"]
    width = len(text) * CHAR_WIDTH + 6
    clip = ""
    if width <= w:
        tx = x + 3
    elif width <= room - w:
        tx = x + w + 3
    else:
        tx = x + 3
        clip = f' clip-path="url(#bar{uid})"'
    role = html.escape(str(bar.get("role") or "driver"))
    side, stroke = "", 'stroke="#444444"'
    if bar["ahead"]:
        batch = "" if bar["batch"] is None else f", the batch of step {bar['batch']}"
        side = f" · rollout side{batch}"
        if bar.get("stream"):
            how = ("the engine loop on its own thread, between two polls"
                   if bar["stream"] == "poll" else "an inline poll")
            side = f" · stream side, {how}, recorded in step {bar.get('step', 0)}"
        stroke = (f'stroke="{ROLLOUT_SIDE_COLOR}" stroke-width="2" '
                  f'stroke-dasharray="5,2" data-side="rollout" data-batch="{bar["batch"]}"')
    name = html.escape(str(bar["node"]))
    return (f'<g class="bar" data-step="{bar.get("step", 0)}"><title>{name} · {role} · '
            f'{secs:.3f}s{side}</title><clipPath id="bar{uid}"><rect x="{x:.1f}" '
            f'y="{y}" width="{w:.1f}" height="{LANE_HEIGHT - 4}"/></clipPath><rect '
            f'x="{x:.1f}" y="{y}" width="{w:.1f}" height="{LANE_HEIGHT - 4}" rx="3" '
            f'fill="{fill}" {stroke}/><text x="{tx:.1f}" y="{y + 15}" font-size="11"{clip}>'
            f'{label}</text></g>')


def _rows_svg(bars: list[dict], left: float, scale: float, span: float, width: float,
              top: float) -> tuple[list[str], float]:
    """A row per pool (None: the driver), its bars in lanes; (svg parts, bottom y)."""
    pools = sorted({b.get("pool") for b in bars}, key=lambda p: (p is None, str(p)))
    colors = role_colors(b["role"] for b in bars if b.get("role"))
    out, y = [], top
    for pool in pools:
        name = "driver" if pool is None else f"pool {pool}"
        row = sorted((b for b in bars if b.get("pool") == pool), key=lambda b: b["start"])
        lanes = _lanes(row)
        height = (max(lanes) + 1) * LANE_HEIGHT + 8
        out.append(f'<g class="row" data-pool="{html.escape(name)}"><rect x="0" y="{y}" '
                   f'width="{width}" height="{height}" fill="#eeeeee" fill-opacity="0.5" '
                   f'stroke="#dddddd"/><text x="8" y="{y + 18}" font-weight="bold">'
                   f'{html.escape(name)}</text>')
        for i, (bar, lane) in enumerate(zip(row, lanes)):
            x = left + bar["start"] * scale
            w = max((bar["end"] - bar["start"]) * scale, 2)
            later = [b["start"] for b, other in zip(row[i + 1:], lanes[i + 1:]) if other == lane]
            room = (min(later, default=span) - bar["start"]) * scale + RIGHT
            out.append(_bar_svg(bar, x, w, y + 4 + lane * LANE_HEIGHT, room,
                                colors.get(bar.get("role"), "#ffffff"), len(out)))
        out.append("</g>")
        y += height + 4
    return out, y


def _secs(t: float, span: float) -> str:
    """Seconds with enough digits that the ticks of a short step differ."""
    return f"{t:.{2 if span >= 0.5 else 3}f}s"


def _axis_svg(starts: list[tuple[int, float]], left: float, scale: float, span: float,
              top: float, bottom: float) -> list[str]:
    """Time ticks; with several steps, a dashed line and a name where each begins."""
    out = []
    for i in range(6):
        t = span * i / 5
        x = left + t * scale
        out.append(f'<line x1="{x:.1f}" y1="{top - 6}" x2="{x:.1f}" y2="{bottom}" '
                   f'stroke="#cccccc" stroke-dasharray="3,3"/><text x="{x:.1f}" '
                   f'y="{top - 10}" font-size="10" text-anchor="middle">{_secs(t, span)}</text>')
    for step, t in starts if len(starts) > 1 else []:
        x = left + t * scale
        out.append(f'<g class="step-start"><line x1="{x:.1f}" y1="{top - 24}" x2="{x:.1f}" '
                   f'y2="{bottom}" stroke="#555555" stroke-dasharray="6,3"/><text '
                   f'x="{x + 3:.1f}" y="{top - 24}" font-size="11" font-weight="bold">'
                   f'step {step}</text></g>')
    return out


def _header(chosen: list[int], span: float, runs: int, sides: TimelineSides | None,
            continuous: bool = False) -> list[str]:
    steps = f"step {chosen[0]}" if len(chosen) == 1 else f"steps {chosen[0]}–{chosen[-1]}"
    title = f"{steps} · {_secs(span, span)} · {runs} node runs"
    if continuous:
        return [title + f" · streaming, trainer.staleness={sides.staleness}, one time axis",
                "dashed blue outline: the stream side, generating across the steps (between "
                "two polls of the engine: its decode steps and the rows that finished)",
                "plain outline: the train side, each bar named with its step; no step "
                "boundaries; blank between two steps: not recorded"]
    lines = [title + (f" · async, trainer.staleness={sides.staleness}" if sides else "")]
    if sides and sides.streaming:
        lines.append("streaming run recorded without record origins: steps laid end to end")
    elif sides:
        lines.append(f"dashed blue outline: rollout side, generating the batch of the step "
                     f"named ({sides.staleness} ahead); plain outline: train side")
    if len(chosen) > 1:
        lines.append("steps laid end to end: the time between two steps is not recorded")
    return lines


def timeline_svg(records: list[dict], step: int | None = None,
                 sides: TimelineSides | None = None,
                 steps: tuple[int, int] | None = None) -> str:
    """SVG text of a Gantt chart: a row per pool (None: driver), a bar per node run;
    one step (default the last recorded) or the recorded steps in `steps` (inclusive)."""
    if not records:
        raise RenderError("the timeline has no records: was the run started with the "
                          "step loop that writes RUN_DIR/timeline.jsonl?")
    chosen = _chosen_steps(records, step, steps)
    continuous = _continuous(records, chosen, sides)
    if continuous:
        bars, starts, span = _laid_continuous(records, chosen, sides)
        bars = [{**b, "streamed": True} for b in bars]
    else:
        bars, starts, span = _laid_out(records, chosen, sides)
    width = min(WIDTH + WIDTH_PER_EXTRA_STEP * (len(chosen) - 1), MAX_WIDTH)
    header = _header(chosen, span, len(bars), sides, continuous)
    top = 48 + 16 * (len(header) - 1) + (14 if len(chosen) > 1 and not continuous else 0)
    pools = {b.get("pool") for b in bars}
    left = 16 + max(len("driver" if p is None else f"pool {p}") for p in pools) * 7.5
    scale = (width - left - RIGHT) / span
    rows, bottom = _rows_svg(bars, left, scale, span, width, top)
    texts = []
    for i, line in enumerate(header):
        style = 'font-size="14" font-weight="bold"' if i == 0 else \
            'font-size="11" fill="#444444"'
        texts.append(f'<text x="8" y="{18 + 16 * i}" {style}>{html.escape(line)}</text>')
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{bottom + 10}" '
            f'font-family="{FONT}, sans-serif" font-size="12">'
            f'<rect width="100%" height="100%" fill="white"/>' + "".join(texts)
            + "".join(_axis_svg([] if continuous else starts, left, scale, span, top, bottom))
            + "".join(rows)
            + "</svg>\n")


def render_timeline(records: list[dict], path, step: int | None = None,
                    sides: TimelineSides | None = None,
                    steps: tuple[int, int] | None = None) -> Path:
    """Write one step (default: the last recorded), or the steps in `steps`, of
    `records` as an SVG Gantt chart."""
    path = Path(path)
    if path.suffix.lower() != ".svg":
        raise RenderError(f"timelines are written as SVG: use a .svg path, not '{path.name}'")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(timeline_svg(records, step, sides, steps))
    return path
