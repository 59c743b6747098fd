"""Timelines of async runs and of several steps (hybridflow/draw/timeline.py), and
`hybridflow render --timeline RUN_DIR --steps A-B` (hybridflow/commands/render.py)."""
from __future__ import annotations

import json
import os
import re

import pytest
from timeline_svg import bars, outline, parse

from hybridflow.draw.style import RenderError
from hybridflow.draw.timeline import TimelineSides, batch_steps, timeline_svg

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ROLLOUT = ("prompts", "rollout.generate", "reward.score", "grpo_advantages")
SIDES = TimelineSides(frozenset(ROLLOUT), staleness=1, source="prompts", last_step=3)


def rollout_call(step: int, t: float) -> list[dict]:
    """One scheduler call's rollout side, from t."""
    return [{"step": step, "node": "prompts", "role": None, "pool": None, "rank": None,
             "start": t, "end": t + .01},
            {"step": step, "node": "rollout.generate", "role": "rollout", "pool": "gen",
             "rank": 0, "start": t + .01, "end": t + 1},
            {"step": step, "node": "reward.score", "role": "reward", "pool": "main",
             "rank": 0, "start": t + 1, "end": t + 1.1},
            {"step": step, "node": "grpo_advantages", "role": None, "pool": None,
             "rank": None, "start": t + 1.1, "end": t + 1.2}]


def train_side(step: int, t: float) -> list[dict]:
    return [{"step": step, "node": "actor.logprob", "role": "actor", "pool": "main",
             "rank": 0, "start": t, "end": t + .3},
            {"step": step, "node": "actor.update", "role": "actor", "pool": "main",
             "rank": 0, "start": t + .3, "end": t + 1}]


def async_records() -> list[dict]:
    """A 3-step run, staleness 1: step 1 warms up (generates batch 1) then trains 1
    while generating 2; step 2 trains 2 while generating 3; step 3 only trains."""
    return (rollout_call(1, 0) + rollout_call(1, 1.3) + train_side(1, 1.3)
            + rollout_call(2, 0) + train_side(2, 0) + train_side(3, 0))


# ----------------------------------------------------------- which batch a bar is
def test_the_first_step_generates_the_warm_up_batch_and_the_next():
    rows = [r for r in async_records() if r["step"] == 1]
    batch = dict(zip(((r["node"], r["start"]) for r in rows), batch_steps(rows, 1, SIDES)))
    assert batch[("rollout.generate", 0.01)] == 1 and batch[("grpo_advantages", 1.1)] == 1
    assert batch[("rollout.generate", 1.31)] == 2 and batch[("reward.score", 2.3)] == 2
    assert batch[("actor.logprob", 1.3)] == batch[("actor.update", 1.6)] == 1


def test_a_steady_step_generates_step_t_plus_k():
    rows = [r for r in async_records() if r["step"] == 2]
    assert batch_steps(rows, 2, SIDES) == [3, 3, 3, 3, 2, 2]
    k2 = TimelineSides(SIDES.rollout, staleness=2, source="prompts", last_step=10)
    assert batch_steps(rows, 2, k2)[:4] == [4, 4, 4, 4]


def test_warm_up_stops_at_the_last_step():
    """staleness 3 in a 2-step run: step 1 generates batches 1 and 2 only."""
    rows = rollout_call(1, 0) + rollout_call(1, 1.3) + train_side(1, 2.6)
    sides = TimelineSides(SIDES.rollout, staleness=3, source="prompts", last_step=2)
    assert batch_steps(rows, 1, sides) == [1] * 4 + [2] * 4 + [1, 1]


def test_without_a_source_to_count_calls_the_batch_is_unknown():
    rows = [r for r in async_records() if r["step"] == 2]
    sides = TimelineSides(SIDES.rollout, staleness=1)
    assert batch_steps(rows, 2, sides) == [None] * 4 + [2, 2]


# ----------------------------------------------------------- the chart
def test_rollout_side_bars_are_outlined_and_named_with_their_batch():
    svg = timeline_svg(async_records(), step=1, sides=SIDES)
    drawn = bars(svg)
    ahead = [b for b in drawn if outline(b).get("data-side") == "rollout"]
    assert len(ahead) == 8 and len(drawn) == 10
    assert sorted(outline(b).get("data-batch") for b in ahead) == ["1"] * 4 + ["2"] * 4
    assert "rollout.generate (step 1)" in svg and "rollout.generate (step 2)" in svg
    assert "actor.update (step" not in svg
    assert "async, trainer.staleness=1" in svg and "dashed blue outline" in svg


def test_a_synchronous_timeline_marks_no_side():
    svg = timeline_svg(async_records(), step=2)
    assert "data-side" not in svg and "async" not in svg and "(step" not in svg


def test_several_steps_are_laid_end_to_end():
    svg = timeline_svg(async_records(), sides=SIDES, steps=(2, 3))
    assert "steps 2–3 ·" in svg and "time between two steps is not recorded" in svg
    drawn = bars(svg)
    assert [b.get("data-step") for b in drawn].count("2") == 6
    assert [b.get("data-step") for b in drawn].count("3") == 2
    starts = re.findall(r'class="step-start"><line x1="([\d.]+)"', svg)
    assert len(starts) == 2
    step3 = float(starts[1])
    for bar in drawn:  # every bar of step 3 right of the line, every bar of 2 left of it
        x, w = float(outline(bar).get("x")), float(outline(bar).get("width"))
        assert (x >= step3) if bar.get("data-step") == "3" else (x + w <= step3)


def test_a_range_without_records_is_refused_naming_the_recorded_steps():
    with pytest.raises(RenderError, match=r"steps 7-9; recorded steps: \[1, 2, 3\]"):
        timeline_svg(async_records(), steps=(7, 9))


# ----------------------------------------------------------- the command
def test_parse_steps():
    from hybridflow.commands.render import parse_steps
    assert parse_steps("3-5") == (3, 5) and parse_steps("4") == (4, 4)
    assert parse_steps(None) is None
    for bad in ("5-3", "a-b", "3-", "-2"):
        with pytest.raises(ValueError, match="--steps"):
            parse_steps(bad)


def run_dir(tmp_path, staleness: int, graph: str = "grpo.py"):
    """A recorded run (plan.json written by compiling the graph here, as `run` does)."""
    from tests.support.recorded_runs import graph_path, record_run
    (tmp_path / "timeline.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in async_records()))
    record_run(tmp_path, graph_path(graph),
               f"trainer:\n  steps: 3\n  staleness: {staleness}\n  allow_uncorrected_async: true\n"
               "placement:\n  pools:\n    gen:\n      devices_per_node: 1\n"
               "  roles:\n    rollout: gen\n")
    return tmp_path


def test_the_sides_of_an_async_run_come_from_its_graph_and_config(tmp_path):
    from hybridflow.commands.render import timeline_sides
    sides, note = timeline_sides(str(run_dir(tmp_path, 1)))
    assert note is None
    assert sides == TimelineSides(frozenset({"prompts", "rollout.generate", "reward.score",
                                             "grpo_advantages", "ref.logprob"}),
                                  staleness=1, source="prompts", last_step=3)
    assert timeline_sides(str(run_dir(tmp_path, 0))) == (None, None)
    # DAPO's gather draws the source again in its rounds: calls cannot be counted
    dapo, _ = timeline_sides(str(run_dir(tmp_path, 1, graph="dapo.py")))
    assert "gather" in dapo.rollout and dapo.source is None


def test_command_draws_steps_of_an_async_run(tmp_path, capsys):
    run_dir(tmp_path, 1)
    command, args = parse(["render", "--timeline", str(tmp_path), "-o",
                           str(tmp_path / "t.svg"), "--steps", "1-2"])
    assert command.run(args) == 0, capsys.readouterr().err
    svg = (tmp_path / "t.svg").read_text()
    assert "steps 1–2 ·" in svg and 'data-side="rollout"' in svg
    assert "rollout.generate (step 3)" in svg


def test_command_draws_the_chart_without_sides_when_the_run_has_no_plan_record(tmp_path,
                                                                              capsys):
    run_dir(tmp_path, 1)
    os.remove(tmp_path / "plan.json")  # a run made before plan.json was written
    command, args = parse(["render", "--timeline", str(tmp_path), "-o",
                           str(tmp_path / "t.svg")])
    assert command.run(args) == 0
    assert "is not marked" in capsys.readouterr().err
    assert "data-side" not in (tmp_path / "t.svg").read_text()


def test_command_refuses_a_bad_range_and_both_step_options(tmp_path, capsys):
    run_dir(tmp_path, 0)
    command, args = parse(["render", "--timeline", str(tmp_path), "-o",
                           str(tmp_path / "t.svg"), "--steps", "5-2"])
    assert command.run(args) == 1 and "--steps '5-2'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse(["render", "--timeline", str(tmp_path), "-o", "t.svg", "--step", "1",
               "--steps", "1-2"])


def test_a_timeline_without_a_config_is_drawn_without_a_note(tmp_path, capsys):
    (tmp_path / "timeline.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in async_records()))
    command, args = parse(["render", "--timeline", str(tmp_path / "timeline.jsonl"), "-o",
                           str(tmp_path / "t.svg")])
    assert command.run(args) == 0
    assert capsys.readouterr().err == ""
