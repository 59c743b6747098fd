"""What the planner returns: the ranking (ranking.py) with its words, JSON and drawing.

It keeps no state of its own; the data lives in `Ranking`. This module sits on
top of explain.py and render.py, which read only ranking.py, so the planner
imports in one direction.
"""
from __future__ import annotations

from .explain import explain, result_json
from .ranking import Ranking
from .render import render_plan


class PlannerResult(Ranking):
    """Ranked candidate plans, with `explain()`, `to_json()` and `render()`."""

    def explain(self) -> str:
        return explain(self)

    def to_json(self) -> dict:
        return result_json(self)

    def render(self, path: str, rank: int = 0) -> str:
        return render_plan(self, path, rank)
