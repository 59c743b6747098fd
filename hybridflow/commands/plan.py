"""`hybridflow plan`: search placements for a graph on a cluster and explain the choice.

    hybridflow plan graphs/ppo.py --nodes 2 --gpus-per-node 8 --device h100 --model 7b
    hybridflow plan graphs/ppo.py --model actor=13b,critic=7b,reward=7b --json
    hybridflow plan graphs/ppo.py --model 70b --nodes 16 --render plan.svg --save placement.yaml
    hybridflow plan --measure-device --save mybox        # this machine as device entry "mybox"
    hybridflow plan --calibrate runs/grpo-1 --device mybox --save mybox-fit
    hybridflow plan graphs/grpo.py --device mybox-fit --nodes 1 --gpus-per-node 1 --model ...
    hybridflow plan graphs/grpo.py --model 7b trainer.staleness=1 actor.off_policy=tis   # async

A bare size (`--model 7b`) applies to every role of the graph except the rule
roles (`--rule-roles`, default `reward`), which run on the driver unless given
a size by name. A size is a name (7b, 13b, ...) or a Hugging Face config.json.
With `trainer.staleness >= 1` the step is pipelined, and the planner also weighs
the rollout on a pool of its own (hybridflow/program/async_planning.py); with
`trainer.async_mode=streaming` it is a producer against a consumer, no barrier
(hybridflow/planner/streaming.py).
"""
from __future__ import annotations

import argparse
import json
import os
import sys

from hybridflow.commands.args import count, number
from hybridflow.core.printable import echo

__all__ = ["add_parser", "parse_models", "run"]


def add_parser(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "plan", help="choose colocation, pool sizes and parallelism for a graph, and explain why",
        description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("graph", nargs="?", help="graph file exporting build(cfg)")
    parser.add_argument("overrides", nargs="*", metavar="key=value",
                        help="config overrides for the graph")
    parser.add_argument("-c", "--config", help="YAML config file, merged before overrides")
    cluster = parser.add_argument_group("cluster")
    cluster.add_argument("--nodes", type=count(1, 100_000, "nodes in the cluster"), default=1)
    cluster.add_argument("--gpus-per-node", type=count(1, 64, "devices one node holds"), default=8)
    cluster.add_argument("--device", default=None,
                         help="a100-80g (the default), a100-40g, a800-80g, h100-80g, "
                              "h200-141g, cpu, or a device entry: NAME in "
                              "~/.hybridflow/devices or a .json path; --calibrate needs it")
    device = parser.add_argument_group("device entries")
    device.add_argument("--measure-device", action="store_true",
                        help="micro-benchmark this machine (matmul, memory, process transfer) "
                             "and print it as a device entry; --save NAME keeps it")
    device.add_argument("--threads", type=count(1, 1024, "torch threads"), default=1,
                        help="torch threads for --measure-device (a run's runtime.torch_threads)")
    device.add_argument("--from-config", action="store_true",
                        help="plan the graph's own run: models, workload and placement from its "
                             "config (as `hybridflow run` would place it), on --device; "
                             "prints each node's predicted seconds")
    device.add_argument("--calibrate", metavar="RUN_DIR",
                        help="fit --device's constants to a run's timeline.jsonl and config; "
                             "--save NAME keeps the fitted entry")
    models = parser.add_argument_group("models")
    models.add_argument("--model", action="append", default=None,
                        help="size for all roles (7b) or per role (actor=7b,critic=13b); "
                             "repeatable")
    models.add_argument("--rule-roles", default="reward",
                        help="comma-separated roles a bare --model size skips (rule functions)")
    work = parser.add_argument_group("workload (one step)")
    work.add_argument("--prompts", type=count(1, 10_000_000, "prompts in one step"), default=1024)
    work.add_argument("--samples", type=count(1, 4096, "responses per prompt"), default=1,
                      help="responses per prompt")
    work.add_argument("--prompt-len", type=count(1, 10_000_000, "tokens"), default=1024)
    work.add_argument("--response-len", type=count(1, 10_000_000, "tokens"), default=1024)
    work.add_argument("--epochs", type=count(1, 1000, "passes over the batch"), default=1,
                      help="PPO epochs over the batch")
    work.add_argument("--mini-batches", type=count(1, 1_000_000, "optimizer steps"), default=8,
                      help="optimizer steps per epoch")
    work.add_argument("--micro-batch-tokens", type=count(1, 1_000_000_000, "tokens"), default=8192,
                      help="tokens per device per pass")
    work.add_argument("--response-mean", type=number(0, 10_000_000), default=0.0,
                      help="mean response tokens (0: every response is --response-len long)")
    work.add_argument("--response-sigma", type=number(0, 10), default=0.6,
                      help="lognormal shape of response lengths around --response-mean")
    work.add_argument("--padded-len", type=count(0, 10_000_000, "tokens; 0: packed"), default=0,
                      help="pad every sequence to this many tokens in passes (0: packed)")
    work.add_argument("--rollout-call", type=count(0, 1_000_000_000, "sequences; 0: one call"),
                      default=0, metavar="N",
                      help="sequences per call to a rollout replica, call after call (a system "
                      "that makes experience micro-batch by micro-batch); 0: one call")
    train = parser.add_argument_group("training backend")
    train.add_argument("--train-backend", default="fsdp", choices=("fsdp", "megatron"))
    train.add_argument("--train-tp", type=count(1, 1024, "devices"), default=1,
                       help="megatron tensor parallel size")
    train.add_argument("--train-pp", type=count(1, 1024, "stages"), default=1,
                       help="megatron pipeline parallel size")
    train.add_argument("--offload", default="none", choices=("none", "optimizer", "all"),
                       help="keep Adam states (optimizer) or also parameters (all) on the host")
    out = parser.add_argument_group("output")
    out.add_argument("--top-k", type=count(1, 1000, "plans"), default=5, help="plans to rank")
    out.add_argument("--json", action="store_true", help="print JSON instead of the table")
    out.add_argument("--render", metavar="PATH", help="draw the best plan (.svg/.png/.pdf/.dot)")
    out.add_argument("--save", metavar="PATH",
                     help="write the best plan as a config's placement section (YAML); with "
                          "--measure-device or --calibrate: the device entry's NAME or .json")
    parser.set_defaults(run=run)
    return parser


DEFAULT_DEVICE = "a100-80g"  # what a plan is for when --device is not given


def load_model_spec(value: str):
    from hybridflow.planner import ModelSpec

    from hybridflow.core.loading import read_json
    path = value if value.endswith(".json") else (
        os.path.join(value, "config.json") if os.path.isdir(value) else value)
    if path.endswith(".json"):
        name = os.path.basename(os.path.dirname(path)) or None
        config = read_json(path, "model config", dict, "give a model's Hugging Face "
                           "config.json (or its directory), or a size like 7b")
        try:
            return ModelSpec.from_hf_config(config, name=name)
        except (KeyError, TypeError, ValueError) as err:
            raise ValueError(f"model config {path!r} is not a model's config "
                             f"({type(err).__name__}: {err})") from None
    return ModelSpec.from_name(value)


def parse_models(values: list[str] | None, roles: list[str], rule_roles: set[str]) -> dict:
    """`--model` values -> {role: ModelSpec}. Later values override earlier ones."""
    models: dict = {}
    for value in values or ["7b"]:
        for item in filter(None, (part.strip() for part in value.split(","))):
            role, sep, size = item.partition("=")
            if not sep:  # a bare size: every role that is not a rule role
                spec = load_model_spec(item)
                models.update({r: spec for r in roles if r not in rule_roles})
            elif role not in roles:
                raise ValueError(f"--model names role {role!r}, which the graph does not "
                                 f"have; roles: {roles}")
            else:
                models[role] = load_model_spec(size)
    return models


def device_roles(plan) -> list[str]:
    """Roles of the graph in order of first appearance."""
    return list(dict.fromkeys(n.role for n in plan.nodes if n.role))


def run(args) -> int:
    from hybridflow.program.assemble import load_plan
    from hybridflow.planner import (Cluster, NoFeasiblePlacement, PlanningError, TrainingBackend,
                                    Workload, plan_placement)

    if args.measure_device or args.calibrate:
        from hybridflow.commands.plan_device import run_device
        return run_device(args)
    args.device = args.device or DEFAULT_DEVICE
    if not args.graph:
        echo("hybridflow plan: give a graph file (or --measure-device / --calibrate RUN_DIR)",
             file=sys.stderr)
        return 2
    from hybridflow.core.files import check_output
    for flag, path in (("--save", args.save), ("--render", args.render)):
        if path:  # checked before the planning, never after it
            check_output(path, flag, "file", inputs=[args.graph, args.config])
    try:
        extra = {"yaml_file": args.config} if args.config else {}
        from hybridflow.program.async_planning import pipeline_view
        if args.from_config:
            result = _plan_from_config(args, extra)
            echo(json.dumps(result.to_json(), indent=2) if args.json else result.explain())
            return 0
        plan, pipeline = pipeline_view(load_plan(args.graph, list(args.overrides or []),
                                                 **extra))
        roles = device_roles(plan)
        rule_roles = {r.strip() for r in args.rule_roles.split(",") if r.strip()}
        models = parse_models(args.model, roles, rule_roles)
        cluster = Cluster(args.nodes, args.gpus_per_node, args.device)
        workload = Workload(args.prompts, args.samples, args.prompt_len, args.response_len,
                            args.epochs, args.mini_batches, args.micro_batch_tokens,
                            args.response_mean, args.response_sigma, args.padded_len,
                            args.rollout_call)
        backend = TrainingBackend(args.train_backend, args.train_tp, args.train_pp, args.offload)
        result = plan_placement(plan, cluster, models, workload, top_k=args.top_k,
                                backend=backend, pipeline=pipeline)
    except NoFeasiblePlacement as err:
        echo(f"hybridflow plan: {err}", file=sys.stderr)
        return 1
    except (PlanningError, ValueError) as err:
        echo(f"hybridflow plan: {err}", file=sys.stderr)
        return 2
    echo(json.dumps(result.to_json(), indent=2) if args.json else result.explain())
    return _write_outputs(result, args)


def _plan_from_config(args, extra: dict):
    """The run `hybridflow run GRAPH overrides` would start, planned on `--device`."""
    from hybridflow.program.async_planning import pipeline_view
    from hybridflow.program.auto_placement import run_models
    from hybridflow.planner import Cluster, plan_placement
    from hybridflow.program.run_dir import run_pools, run_workload
    from hybridflow.program.run_record import run_roles
    from hybridflow.program.assemble import prepare

    loaded = prepare(args.graph, list(args.overrides or []), extra.get("yaml_file"),
                     preflight=False)
    plan, pipeline = pipeline_view(loaded.plan)
    models = run_models(loaded.cfg, plan)
    devices, grouping = run_pools(loaded.cfg, run_roles(loaded.plan, pipeline, models))
    return plan_placement(plan, Cluster(1, devices, args.device), models,
                          run_workload(loaded.cfg, [], ()), top_k=1, groupings=[grouping],
                          pipeline=pipeline)


def _write_outputs(result, args) -> int:
    if args.save:
        import yaml

        with open(args.save, "w") as handle:
            yaml.safe_dump({"placement": result.best.to_placement_config()}, handle,
                           sort_keys=False)
        echo(f"placement written to {args.save}", file=sys.stderr)
    if args.render:
        from hybridflow.planner.render import RenderError

        try:
            echo(f"plan drawn to {result.render(args.render)}", file=sys.stderr)
        except RenderError as err:
            echo(f"hybridflow plan: {err}", file=sys.stderr)
            return 2
    return 0
