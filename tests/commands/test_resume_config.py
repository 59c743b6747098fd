"""Issue 36, item 8: a resume is checked against the run's own config, not the defaults.

The resumed config is the run's config.yaml plus the resume's overrides, and every
check a fresh run's config goes through (config values, the compiler's off-policy
rule, pre-flight) sees that merge: a run saved with `actor.off_policy=tis` resumes at a
larger `trainer.staleness` and keeps its correction; a run saved without one is
refused with the very words a fresh run with the same keys gets; an override that
changes `actor.off_policy` on resume is honoured. Each combination, from recorded runs
(no worker starts: the checks run before any)."""
from __future__ import annotations

import os

import pytest

from hybridflow.cli import main
from hybridflow.commands.resume import resumed_program
from hybridflow.plan.compiler import GraphError
from hybridflow.program.assemble import prepare
from hybridflow.program.config import ConfigError
from hybridflow.run.tracking import RunDir
from tests.support.recorded_runs import graph_path, record_run

GRPO = graph_path("grpo.py")
SIZES = ("data.batch_size=4", "rollout.n=2", "actor.mini_batch_size=8")


def _yaml(keys: tuple[str, ...]) -> str:
    """The saved config's own keys as YAML (`a.b=c` -> a: {b: c})."""
    from omegaconf import OmegaConf
    return OmegaConf.to_yaml(OmegaConf.from_dotlist([*SIZES, *keys]))


def _recorded(tmp_path, saved: tuple[str, ...]) -> RunDir:
    folder = record_run(tmp_path / "run", GRPO, _yaml(saved))
    return RunDir(folder, create=False)


def _plan_staleness(loaded) -> int:
    from hybridflow.program.async_planning import pipeline_view
    _, pipeline = pipeline_view(loaded.plan)
    return 0 if pipeline is None else pipeline.staleness


def _refusal(action) -> str:
    with pytest.raises((GraphError, ConfigError)) as caught:
        action()
    return str(caught.value)


# (the run's own keys, the resume's overrides, what the resume runs with or None: refused)
CASES = [
    (("actor.off_policy=tis", "trainer.staleness=1"), ("trainer.staleness=2",), ("tis", 2)),
    (("actor.off_policy=tis", "trainer.staleness=1"), (), ("tis", 1)),
    (("actor.off_policy=tis", "trainer.staleness=1"),
     ("actor.off_policy=decoupled", "trainer.staleness=2"), ("decoupled", 2)),
    (("actor.off_policy=tis", "trainer.staleness=1"), ("actor.off_policy=none",), None),
    (("actor.off_policy=decoupled", "trainer.staleness=2"), ("trainer.staleness=0",),
     ("decoupled", 0)),
    ((), ("trainer.staleness=2",), None),
    ((), ("trainer.staleness=1", "actor.off_policy=tis"), ("tis", 1)),
    (("trainer.staleness=1", "trainer.allow_uncorrected_async=true"), ("trainer.staleness=2",),
     ("none", 2)),
    (("trainer.staleness=1", "trainer.allow_uncorrected_async=true"),
     ("trainer.allow_uncorrected_async=false",), None),
]


@pytest.mark.parametrize("saved, resumed, expected", CASES,
                         ids=[f"{'+'.join(s) or 'sync'}->{'+'.join(r) or 'same'}"
                              for s, r, _ in CASES])
def test_a_resume_is_checked_against_the_runs_own_config(saved, resumed, expected, tmp_path):
    run = _recorded(tmp_path, saved)
    overrides = list(resumed)

    def resume():
        return resumed_program(GRPO, "grpo", overrides, None, run, say=lambda _: None)

    if expected is None:  # the words a fresh run with the same keys gets
        fresh = _refusal(lambda: prepare(GRPO, [*SIZES, *saved, *overrides]))
        assert _refusal(resume) == fresh
        return
    loaded, changes = resume()
    assert (loaded.cfg.actor.off_policy, loaded.cfg.trainer.staleness) == expected
    assert _plan_staleness(loaded) == expected[1]
    assert len(changes) == len(resumed)  # each key asked for is said, nothing else changed


def test_the_cli_refuses_a_resume_with_the_words_of_a_fresh_run(tmp_path, capsys):
    """Saved synchronous and uncorrected, resumed at staleness 2: the one line of a fresh
    run with the run's keys and the override, and nothing in the run is written."""
    run = _recorded(tmp_path, ())
    before = {n: open(os.path.join(run.path, n), "rb").read() for n in os.listdir(run.path)}
    common = [f"trainer.runs_dir={tmp_path / 'fresh'}", "trainer.staleness=2"]
    assert main(["run", GRPO, *SIZES, *common]) == 1
    fresh = capsys.readouterr().err
    assert "off-policy correction" in fresh
    assert main(["run", GRPO, "--resume", run.path, *common]) == 1
    assert capsys.readouterr().err == fresh
    assert {n: open(os.path.join(run.path, n), "rb").read()
            for n in os.listdir(run.path)} == before


@pytest.mark.slow  # a pipelined step, then a resume that trains one more (~15 s)
def test_the_cli_resumes_a_corrected_run_at_a_larger_staleness(tmp_path, capsys):
    """The issue's case end to end: saved pipelined with actor.off_policy=tis, resumed
    with a larger trainer.staleness: not refused, and the config it records keeps tis."""
    args = ["run", GRPO, f"trainer.runs_dir={tmp_path}", "trainer.run_name=run", *SIZES,
            "trainer.val_every=0", "trainer.progress=false", "actor.micro_batch_size=8"]
    assert main([*args, "trainer.steps=1", "actor.off_policy=tis",
                 "trainer.staleness=1"]) == 0
    capsys.readouterr()
    code = main([*args, "--resume", str(tmp_path / "run"), "trainer.steps=2",
                 "trainer.staleness=2"])
    err = capsys.readouterr().err
    assert code == 0, err
    assert "changed on resume: trainer.staleness: 1 -> 2" in err
    assert f"resumed from {tmp_path / 'run'}/checkpoints/step_000001 (step 1)" in err
    saved = (tmp_path / "run" / "config.yaml").read_text()
    assert "off_policy: tis" in saved and "staleness: 2" in saved
