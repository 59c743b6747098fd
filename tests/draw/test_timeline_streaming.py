"""A streaming run's timeline on one continuous time axis (draw/timeline.py,
`TimelineSides.streaming`): the stream side generating across the train steps."""
from __future__ import annotations

import re

import pytest
from timeline_svg import bars, outline, parse

from hybridflow.draw.timeline import TimelineSides, timeline_svg

SIDES = TimelineSides(frozenset({"prompts", "rollout.generate"}), staleness=2,
                      source="prompts", last_step=3, streaming=True)


def step_records(step: int, origin: float) -> list[dict]:
    """One step as the run writes it: seconds from the step's first record, its origin."""
    rows = [("rollout.generate", "rollout", "gen", 0.0, 1.9,
             {"stream": "poll", "decode_steps": 40, "rows": 8}),
            ("actor.logprob", "actor", "main", 1.0, 1.3, {}),
            ("actor.update", "actor", "main", 1.3, 1.8, {}),
            ("weight_sync", "rollout", "gen", 1.8, 1.85, {})]
    return [{"step": step, "node": n, "role": role, "pool": pool, "rank": 0, "start": a,
             "end": b, "origin": origin, **extra} for n, role, pool, a, b, extra in rows]


RECORDS = step_records(1, 100.0) + step_records(2, 102.0) + step_records(3, 104.0)


def x_span(bar) -> tuple[float, float]:
    rect = outline(bar)
    return float(rect.get("x")), float(rect.get("x")) + float(rect.get("width"))


def test_the_steps_lie_on_one_time_axis_with_no_step_lines():
    svg = timeline_svg(RECORDS, sides=SIDES, steps=(1, 3))
    assert "step-start" not in svg and "one time axis" in svg
    assert "steps 1–3 · 5.90s" in svg  # 104 + 1.9 - 100
    drawn = bars(svg)
    assert len(drawn) == 12
    update = {b.get("data-step"): x_span(b) for b in drawn if "actor.update (step" in
              "".join(b.itertext())}
    # the origins place step 2's update exactly 2 s after step 1's
    left, scale = update["1"][0], (update["1"][1] - update["1"][0]) / 0.5
    assert update["2"][0] == pytest.approx(left + 2.0 * scale, abs=0.2)


def test_the_stream_side_is_outlined_named_with_its_counts_and_spans_the_train_pass():
    svg = timeline_svg(RECORDS, sides=SIDES, steps=(1, 3))
    drawn = bars(svg)
    stream = [b for b in drawn if outline(b).get("data-side") == "rollout"]
    assert len(stream) == 3
    assert "rollout.generate: 40 decode steps, 8 rows done" in svg
    assert "stream side, the engine loop on its own thread, between two polls" in svg
    assert "actor.update (step 3)" in svg and "weight_sync (step 2)" in svg
    generate = x_span(stream[0])
    update = next(x_span(b) for b in drawn if b.get("data-step") == "1"
                  and "actor.update" in "".join(b.itertext()))
    assert generate[0] < update[0] and update[1] < generate[1]  # generation goes on


def test_a_streaming_run_recorded_without_origins_is_laid_end_to_end_and_says_so():
    old = [{k: v for k, v in r.items() if k != "origin"} for r in RECORDS]
    svg = timeline_svg(old, sides=SIDES, steps=(1, 2))
    assert "without record origins: steps laid end to end" in svg
    assert len(re.findall('class="step-start"', svg)) == 2


def test_the_command_draws_a_recorded_streaming_run_on_one_axis(tmp_path, capsys):
    """`hybridflow render --timeline RUN_DIR`: the mode comes from the run's config.yaml,
    the stream side from its plan.json (the graph file is never imported)."""

    from hybridflow.commands.render import timeline_sides
    from tests.support.recorded_runs import graph_path, record_run, write_jsonl
    write_jsonl(tmp_path / "timeline.jsonl", RECORDS)
    record_run(tmp_path, graph_path("grpo.py"),
               "trainer:\n  steps: 3\n  staleness: 2\n  async_mode: streaming\n"
               "actor:\n  off_policy: decoupled\n")
    sides, note = timeline_sides(str(tmp_path))
    assert note is None and sides.streaming
    # trainer.stream_side=auto: GRPO's reward, advantages and reference are stream-side
    assert sides.rollout == frozenset({"prompts", "rollout.generate", "reward.score",
                                       "grpo_advantages", "ref.logprob"})
    command, args = parse(["render", "--timeline", str(tmp_path), "-o",
                           str(tmp_path / "t.svg"), "--steps", "1-3"])
    assert command.run(args) == 0, capsys.readouterr().err
    svg = (tmp_path / "t.svg").read_text()
    assert "one time axis" in svg and "step-start" not in svg
    assert "rollout.generate: 40 decode steps, 8 rows done" in svg
