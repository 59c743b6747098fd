"""What the graph drawing (draw/graph.py) and the timeline (draw/timeline.py) share: the
font, the role colours, the error a drawing that cannot be written raises. Stateless."""
from __future__ import annotations

import zlib

__all__ = ["RenderError", "FONT", "PALETTE", "DRIVER_FILL", "ROLLOUT_SIDE_COLOR",
           "CROSSING_COLOR", "role_colors"]

FONT = "Helvetica"
# Colour-blind-friendly pastels; a role keeps its colour from plan to plan.
PALETTE = ("#8dd3c7", "#ffffb3", "#bebada", "#fb8072", "#80b1d3", "#fdb462",
           "#b3de69", "#fccde5", "#bc80bd", "#ccebc5", "#ffed6f", "#d9d9d9")
DRIVER_FILL = "#ffffff"
# async (trainer.staleness >= 1): the outline of rollout-side nodes and bars, and the
# edges where samples wait between the sides (dark blue and orange: told apart from
# the pastel fills and from each other by colour-blind readers too)
ROLLOUT_SIDE_COLOR = "#1f5fa8"
CROSSING_COLOR = "#d95f02"


class RenderError(RuntimeError):
    """A drawing that cannot be written; the message says what to install or change."""


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
