"""What `hybridflow run --resume` checks before a worker starts or anything in the run
directory is written, and what it resumes with (issue 36, items 0 and 8).

A resume is checked against the run's own config, never the defaults: the run is
found first (from the graph's name and `trainer.runs_dir` / `trainer.run_name`, the
only keys read before it is), then its config.yaml, with `--config` and the command
line's overrides on top, goes through every check a fresh run's config goes through
(`prepare`: config values, compiler, pre-flight). So an override that is valid for
the run (a larger `trainer.staleness` for a run saved with `actor.off_policy=tis`) is
accepted, and one that is not is refused with the words a fresh run gets. Stateless.
"""
from __future__ import annotations

import os
import tempfile

from omegaconf import DictConfig, OmegaConf

from hybridflow.core.loading import read_yaml
from hybridflow.program.assemble import LoadedGraph, prepare
from hybridflow.program.run_record import read_run_config
from hybridflow.run.lifecycle import (check_resumed_config, check_same_graph, explicit_keys,
                                      graph_identity)
from hybridflow.run.tracking import RunDir, newest_run_dir

__all__ = ["LOCATING_KEYS", "graph_and_trainer", "resume_dir", "resumed_program"]

# the keys read before the run is found: where runs are, and which one
LOCATING_KEYS = ("trainer.runs_dir", "trainer.run_name")


def graph_and_trainer(graph: str, overrides: list[str], yaml_file: str | None):
    """(the graph's name, the trainer section) as the command line gives them, with
    only the locating keys of its overrides: every other key is checked against the
    run's own config once the run is found."""
    from hybridflow.program.assemble import algorithm_schema, role_schema
    from hybridflow.program.config import build_config
    from hybridflow.program.user_files import call_graph_file, load_graph_module
    module = load_graph_module(graph)
    defaults = call_graph_file(graph, "defaults()", module.defaults) \
        if callable(getattr(module, "defaults", None)) else None
    locating = [o for o in overrides if o.partition("=")[0].strip() in LOCATING_KEYS]
    if not isinstance(defaults, (dict, DictConfig)):
        defaults = None  # prepare() names what is wrong with it
    cfg = build_config(defaults, yaml_file, locating,
                       algorithm=algorithm_schema(module, graph), role_schema=role_schema)
    built = call_graph_file(graph, "build(cfg)", module.build, cfg)
    return getattr(built, "name", None), cfg.trainer


def resume_dir(resume: str, newest: bool, graph_name: str, trainer) -> RunDir:
    """The run directory `--resume` names (`newest`: the run of trainer.run_name, else
    the newest run of the graph); FileNotFoundError when there is none."""
    if newest and trainer.run_name:
        path = os.path.join(trainer.runs_dir, trainer.run_name)
        if not os.path.lexists(os.path.join(path, "config.yaml")):
            raise FileNotFoundError(f"--resume: no run named {trainer.run_name!r} in "
                                    f"{trainer.runs_dir!r}")
        return RunDir(path, create=False)
    if newest:
        return newest_run_dir(trainer.runs_dir, graph_name)
    if not os.path.lexists(os.path.join(resume, "config.yaml")):
        raise FileNotFoundError(f"--resume {resume}: not a run directory (no config.yaml)")
    return RunDir(resume, create=False)


def resumed_program(graph: str, graph_name: str, overrides: list[str],
                    yaml_file: str | None, run_dir: RunDir,
                    say) -> tuple[LoadedGraph, list[str]]:
    """The run's own config plus this command line's keys, through every check of a
    fresh run, and matched against the run (same graph, no change not asked for)
    before anything is written. `say` prints at once that the graph file was edited
    (it explains a refusal that follows); the changes asked for are returned, to be
    said once the resume goes ahead."""
    for note in check_same_graph(run_dir, graph_identity(graph_name, graph)):
        say(note)
    saved = read_run_config(run_dir.path, typed=False)
    with tempfile.TemporaryDirectory() as scratch:  # never written into the run
        base = os.path.join(scratch, "config.yaml")  # the run's config, then --config's
        OmegaConf.save(OmegaConf.merge(saved, read_yaml(yaml_file, "config file"))
                       if yaml_file else saved, base)
        resumed = prepare(graph, overrides, base)
    return resumed, check_resumed_config(run_dir, saved, resumed.cfg,
                                         explicit_keys(overrides, yaml_file))
