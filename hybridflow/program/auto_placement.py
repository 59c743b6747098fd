"""`placement.auto=true` (or `placement=auto` on the command line): run the planner
on the compiled graph and use its best placement for the run.

The cluster is `placement.cluster`; model shapes come from each role's model config;
the workload from the data and rollout sections. Roles without a model (a rule
reward) run beside the others and cost the planner nothing. With
`trainer.staleness >= 1` the planner times pipelined steps (streaming ones with
`trainer.async_mode=streaming`) and may place the rollout role on a pool of its own
(`placement.roles.rollout`), choosing how many devices each side gets.

The planner offers a generating role tensor parallelism only where the run can build
it, read from what is declared, not from names: the engine of `rollout.backend`
registered `tensor_parallel=True`, and the runtime runs each rank as a process
(`RuntimeName.process_per_rank`); otherwise it plans generation at tp=1. It may split
a role's rows over sp ranks (sequence parallelism, where a row does not fit a device
at sp=1) only where the run can: a process per rank, no LoRA, and a model whose
attention the workers wrap (`can_split_rows`).
"""
from __future__ import annotations

import os

from omegaconf import DictConfig, OmegaConf

from hybridflow.core.modes import run_modes
from hybridflow.plan.compiler import ExecutionPlan
from hybridflow.program.config import ConfigError

__all__ = ["AUTO_OVERRIDE", "expand_auto", "plan_auto_placement", "run_models",
           "generation_tp", "generation_layouts", "can_split_rows"]

AUTO_OVERRIDE = "placement=auto"


def expand_auto(overrides: list[str] | None) -> list[str]:
    """`placement=auto` is shorthand for `placement.auto=true`."""
    return ["placement.auto=true" if o == AUTO_OVERRIDE else o for o in overrides or []]


def _hf_config(cfg: DictConfig) -> dict:
    if cfg.model.path:
        from hybridflow.core.loading import read_json
        path = os.path.join(cfg.model.path, "config.json")
        if os.path.lexists(path):
            return read_json(path, "model config", dict, "model.path must be a Hugging Face "
                             "model directory with a JSON config.json")
    config = dict(OmegaConf.to_container(cfg.model.hf_config, resolve=True))
    config.setdefault("vocab_size", 32)  # the char tokenizer's size order; shapes only
    return config


def run_models(cfg: DictConfig, plan: ExecutionPlan) -> dict:
    """{role: ModelSpec} of the roles that hold a model (a rule reward holds none)."""
    from hybridflow.planner import ModelSpec
    try:
        spec = ModelSpec.from_hf_config(_hf_config(cfg), name="model")
    except (ValueError, TypeError) as err:  # shapes the planner cannot read
        key = f"model.path {cfg.model.path!r}" if cfg.model.path else "model.hf_config"
        raise ConfigError(f"{key}: {err}") from None
    roles = {"actor", "ref", "critic"} | ({"reward"} if cfg.reward.model_path else set())
    return {role: spec for role in plan.roles if role in roles}


def plan_auto_placement(cfg: DictConfig, plan: ExecutionPlan) -> tuple[dict, str]:
    """The planner's best placement section for this run, and its explanation."""
    from hybridflow.program.async_planning import pipeline_view
    from hybridflow.planner import Cluster, PlanningError, Workload, plan_placement
    cluster_cfg = cfg.placement.cluster
    # a colocated rollout is planned as the actor; with trainer.staleness >= 1 the
    # planner also weighs it on a pool of its own, weights synced (async_planning.py)
    from hybridflow.agents.worker import episode_width
    width = episode_width(cfg, plan) or cfg.rollout.max_new_tokens  # an agent's episodes
    compiled = plan  # the planner's view renames a folded rollout's nodes to its host's
    modes = run_modes(cfg)
    plan, pipeline = pipeline_view(plan, cfg.trainer.staleness, modes.async_mode,
                                   modes.stream_side)
    try:
        result = plan_placement(
            plan, Cluster(cluster_cfg.nodes, cluster_cfg.devices_per_node, cluster_cfg.device),
            run_models(cfg, plan),
            Workload(prompts=cfg.data.batch_size, samples_per_prompt=cfg.rollout.n,
                     prompt_len=cfg.data.max_prompt_length,
                     response_len=width,
                     ppo_epochs=cfg.actor.ppo_epochs,
                     mini_batches=max(1, -(-cfg.data.batch_size * cfg.rollout.n
                                          // cfg.actor.mini_batch_size))),
            rollout_tp=generation_tp(cfg), pipeline=pipeline,
            sequence_parallel=can_split_rows(cfg))
    except (PlanningError, ValueError) as err:
        raise ConfigError(f"placement=auto: {err}") from None
    return generation_layouts(result.best.to_placement_config(), compiled), result.explain()


def can_split_rows(cfg: DictConfig) -> bool:
    """Whether the run could run a role sequence-parallel: what pre-flight refuses at
    sp > 1 apart from the size (program/parallel_checks._check_sequence_parallel).
    LoRA is no refusal: its adapters replicate over sp like the weights, and the
    planner trains at tp=1 (LoRA stays refused at tp > 1, which it never plans)."""
    if not run_modes(cfg).runtime.process_per_rank:
        return False
    from hybridflow.core.layout import RoleLayout
    from hybridflow.core.model_config import standard_shapes
    from hybridflow.workers.parallel.sequence_parallel import check_model
    config = standard_shapes(_hf_config(cfg))
    inner = config.get("attn_implementation") or config.get("_attn_implementation")
    try:  # the size-independent refusals: sliding windows, an attention it cannot wrap
        check_model(config, RoleLayout(1, role="actor"), inner or "sdpa")
    except ValueError:
        return False
    return True


def generation_tp(cfg: DictConfig) -> int:
    """The planner's `rollout_tp`: 0 (it picks) when the engine and the runtime can run
    a generating role tensor-parallel, else 1."""
    from hybridflow.workers.rollout.engine import engine_supports_tp
    able = engine_supports_tp(str(cfg.rollout.backend)) and \
        run_modes(cfg).runtime.process_per_rank
    return 0 if able else 1


def generation_layouts(section: dict, plan: ExecutionPlan) -> dict:
    """The planner's layout of a role that generates through a folded rollout is the
    layout it generates in (its training is costed as FSDP over the whole pool): the
    tp moves to the rollout role, which runs in the host's processes, and the host
    trains data-parallel over every rank -- two layouts in the same processes, the
    layout the workers build and `check` prints."""
    parallel = section.get("parallel", {})
    generating = {n.role for n in plan.nodes if n.kind.generates}
    for role, host in plan.placement.folded.items():
        layout = parallel.get(host)
        if role in generating and layout and layout.get("tp", 1) > 1 and role not in parallel:
            parallel[role] = {"dp": layout["dp"], "tp": layout["tp"]}
            parallel[host] = {"dp": layout["dp"] * layout["tp"], "tp": 1}
    return section
