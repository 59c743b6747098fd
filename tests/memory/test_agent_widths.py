"""Issue 26 class 13 (memory part): `check --memory` lays an agent rollout's batch out
`agent.max_response_tokens` wide — the episodes' width — not `rollout.max_new_tokens`
(one turn's budget, which made it ~4x under). Swept over widths and turn budgets:
every pass of the actor over the agent's batch follows the episode width only."""
from __future__ import annotations

import os

import pytest

from hybridflow.memory.report import plan_memory
from hybridflow.program.assemble import prepare

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
AGENT = os.path.join(REPO, "graphs", "agent_grpo.py")


def _passes(width: int, turn_budget: int) -> dict[str, int]:
    loaded = prepare(AGENT, [f"agent.max_response_tokens={width}",
                             f"agent.max_turn_tokens={min(24, width)}",
                             f"rollout.max_new_tokens={turn_budget}"], preflight=False)
    actor = next(r for r in plan_memory(loaded.cfg, loaded.plan).roles if r.role == "actor")
    return {name: sum(parts.values()) for name, parts in actor.passes.items()}


@pytest.mark.parametrize("width", [32, 64, 256])
def test_the_agent_width_not_the_turn_budget_sets_every_pass(width):
    assert _passes(width, 8) == _passes(width, 512)


def test_wider_episodes_need_more_memory():
    small, large = _passes(32, 8), _passes(256, 8)
    assert small.keys() == large.keys() and small
    assert all(large[name] > small[name] for name in small)
