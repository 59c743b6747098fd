"""bench/agent.py still runs end to end (tiny sizes) and both schedules play the same
episodes; speed is not asserted -- that is what the benchmark reports."""
from __future__ import annotations

import json
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, REPO)


def test_agent_bench_alternates_both_schedules_on_the_same_episodes(tmp_path):
    from bench import agent
    out = tmp_path / "agent.json"
    payload = agent.run(episodes=8, max_active=4, reps=1, gen_ms=1.0, max_latency_ms=2.0,
                        out=str(out), quiet=True)
    assert payload["same_episodes"] is True
    assert [r["variant"] for r in payload["rows"]] == ["continuous", "lockstep"]
    assert json.loads(out.read_text())["targets"]["target"] == agent.TARGET_SPEEDUP
    assert "episodes/s" in agent.report(payload)
