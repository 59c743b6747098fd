"""Pre-flight of each role's parallel layout: what `placement.parallel.<role>` asks for
is what its workers can build, or the run is refused before any worker starts.

A role on a pool of W ranks with tensor-parallel size tp runs W / tp data-parallel
groups of tp ranks (rank r: dp r // tp, tp r % tp). With tp > 1:
- `dp` (when given) times `tp` fills the pool exactly;
- tp divides the attention heads and the key/value heads of the role's model (each
  rank holds whole heads), checked against the model's config.json or hf_config;
- a role that trains has a training backend that shards by tensor parallelism
  (`<role>.strategy`; a backend class declares `tensor_parallel = True`);
- a role that generates has a rollout engine that runs tensor-parallel
  (`rollout.backend`; registered with `register_engine(..., tensor_parallel=True)`, or
  a 'module:factory' engine whose factory says `tensor_parallel = True`), and, where
  the engine pins each rank to cores of its own on the CPU (`factory.pins_cores`:
  `vllm`), tp cores a worker process may run on (the worker's own check, `check_tp_cores`);
- the runtime runs each rank as a process (`RuntimeName.process_per_rank`: `ray`); the
  local runtime simulates ranks in one process, where no collective can run;
- a tensor-parallel actor trains no LoRA adapters (no plan shards them);
- with sp > 1 (`placement.parallel.<role>.sp`, alone or with tp): a process-per-rank
  runtime, a role that trains or computes log-probs/values, and heads and key/value
  heads that sp x tp divides (`_check_sequence_parallel`);
- `trainer.async_mode=streaming` through an engine that cannot stream on a model
  sharded over ranks (the `hf` engine declares `streams_sharded = False`): its model
  is tensor-parallel, or an FSDP actor sharded over dp > 1 ranks serves it.
Each failure is a ConfigError naming the role, the key and the numbers. Stateless.
"""
from __future__ import annotations

import os

from omegaconf import DictConfig, OmegaConf

from hybridflow.core.constraints import ConfigError
from hybridflow.core.kinds import NodeKind
from hybridflow.core.layout import RoleLayout, refuse_not_tensor_parallel
from hybridflow.core.model_config import standard_shapes
from hybridflow.core.modes import RuntimeName
from hybridflow.plan.compiler import ExecutionPlan

__all__ = ["check_parallel_layouts", "role_layout", "role_model_config",
           "check_streaming_layout", "runs_on_cpu"]

# the section holding a role's own model directory; a role without one (or whose key
# is unset) runs the policy's model (`model.path` / `model.hf_config`)
_ROLE_MODEL_KEYS = {"ref": "ref.path", "critic": "critic.path"}
_MODEL_ROLES = ("actor", "rollout", "ref", "critic")  # the roles that run a transformer


def role_layout(plan: ExecutionPlan, role: str) -> tuple[int, int]:
    """(dp, tp) the role's workers build on its pool (`core/layout.RoleLayout`)."""
    layout = plan.placement.layout(role)
    return layout.dp, layout.tp


def role_model_config(cfg: DictConfig, role: str) -> dict | None:
    """The Hugging Face config (as a dict) of the model a role runs, or None where the
    role runs no transformer the config describes (a rule-based reward, say)."""
    from hybridflow.program.model_checks import read_model_dir
    key = _ROLE_MODEL_KEYS.get(role)
    spec = OmegaConf.select(cfg, key) if key else None
    if role not in _MODEL_ROLES:
        return None
    spec = spec or cfg.model.path
    if spec:
        return read_model_dir(os.path.expanduser(str(spec)))
    return OmegaConf.to_container(cfg.model.hf_config, resolve=True)


def check_parallel_layouts(cfg: DictConfig, plan: ExecutionPlan) -> None:
    for role, entry in sorted(plan.placement.parallel.items()):
        if role not in plan.placement.roles:
            continue
        dp, tp = role_layout(plan, role)
        pool = plan.placement.roles[role]
        where = f"placement.parallel.{role}"
        if "dp" in entry and entry["dp"] != dp:
            raise ConfigError(
                f"{where}: dp={entry['dp']} x tp={tp} = {entry['dp'] * tp} ranks, but pool "
                f"'{pool}' has {dp * tp}: a role's dp x tp fills its pool (set dp={dp}, or "
                f"resize placement.pools.{pool})")
        if plan.placement.sp_size(role) > 1:
            _check_sequence_parallel(cfg, plan, role)
        if tp == 1:
            continue
        if not RuntimeName.of(cfg.runtime.name).process_per_rank:
            raise ConfigError(
                f"{where}.tp={tp}: the local runtime runs every rank in one process, where "
                f"tensor-parallel collectives cannot run; use --runtime ray (or tp=1)")
        _check_heads(cfg, plan.placement.layout(role))
        _check_plan(cfg, role, tp)
        # a folded role (the rollout served by the actor) runs in its host's layout
        kinds = {n.kind for n in plan.nodes
                 if role in (n.role, plan.placement.folded.get(n.role))}
        if any(kind.trains for kind in kinds):
            _check_backend(cfg, role, tp)
            if role == "actor":  # the one role with adapters (actor.lora)
                from hybridflow.workers.parallel.tensor_parallel import refuse_lora
                try:
                    refuse_lora(role, tp, int(cfg.actor.lora.rank or 0))
                except ValueError as err:
                    raise ConfigError(str(err)) from None
        if NodeKind.GENERATE in kinds:
            _check_engine(cfg, role, tp)
            _check_engine_cores(cfg, plan, role, tp)
    check_streaming_layout(cfg, plan)


def _check_sequence_parallel(cfg: DictConfig, plan: ExecutionPlan, role: str) -> None:
    """placement.parallel.<role>.sp > 1 (workers/parallel/sequence_parallel.py): Ray only,
    a role that trains or computes log-probs/values, a model whose attention it wraps with
    heads that sp x tp divides (each rank's heads / tp split again over sp). With tp it
    composes (the tp checks below apply as at sp=1; LoRA stays refused at tp > 1 there);
    LoRA at tp=1 composes (adapters replicate over sp like the weights)."""
    layout = plan.placement.layout(role)
    where = f"placement.parallel.{role}.sp={layout.sp}"
    if not RuntimeName.of(cfg.runtime.name).process_per_rank:
        raise ConfigError(f"{where}: the local runtime runs every rank in one process, where "
                          "sequence-parallel collectives cannot run; use --runtime ray "
                          "(or sp=1)")
    kinds = {n.kind for n in plan.nodes if n.role == role}
    if kinds and not kinds & {NodeKind.TRAIN, NodeKind.INFERENCE}:
        raise ConfigError(f"{where}: role '{role}' only generates, and generation never "
                          "runs sequence-parallel; set sp on the roles that train or "
                          "compute log-probs (actor, ref, critic)")
    config = role_model_config(cfg, role)
    if config:
        from hybridflow.workers.parallel.sequence_parallel import check_model
        config = standard_shapes(config)
        inner = config.get("attn_implementation") or config.get("_attn_implementation")
        try:
            check_model(config, layout, inner or "sdpa")
        except ValueError as err:
            raise ConfigError(str(err)) from None


def _check_heads(cfg: DictConfig, layout: RoleLayout) -> None:
    config = role_model_config(cfg, layout.role)
    if not config:
        return
    config = standard_shapes(config)  # GPT-2's n_head is its num_attention_heads
    try:
        layout.check_heads(config.get("num_attention_heads"),
                           config.get("num_key_value_heads"))
    except ValueError as err:
        raise ConfigError(str(err)) from None


def _check_backend(cfg: DictConfig, role: str, tp: int) -> None:
    from hybridflow.workers.backends import BACKENDS
    section = cfg.get(role) if role in cfg else None
    name = section.get("strategy") if isinstance(section, DictConfig) else None
    if name is None:
        return  # the role trains through another role's section (checked there)
    backend = BACKENDS.get(str(name))
    if backend is not None and not getattr(backend, "tensor_parallel", False):
        able = [n for n, b in BACKENDS.items() if getattr(b, "tensor_parallel", False)]
        try:
            refuse_not_tensor_parallel("training strategy", f"{role}.strategy", str(name),
                                       able, role=role, tp=tp)
        except ValueError as err:
            raise ConfigError(str(err)) from None


def _check_engine(cfg: DictConfig, role: str, tp: int) -> None:
    from hybridflow.workers.rollout.engine import engine_supports_tp, engine_names
    name = str(cfg.rollout.backend)
    if not engine_supports_tp(name):
        able = [n for n in engine_names() if engine_supports_tp(n)]
        raise ConfigError(
            f"placement.parallel.{role}.tp={tp}: rollout engine rollout.backend={name!r} "
            f"does not generate tensor-parallel; use one that does ({', '.join(able) or 'none'})"
            f" or tp=1 for role '{role}'")


def _check_engine_cores(cfg: DictConfig, plan: ExecutionPlan, role: str, tp: int) -> None:
    """An engine that pins each rank of a tp group to cores of its own (`vllm` on the
    CPU) needs tp cores in what a worker process may run on: its slice of the pool's
    `cores` when listed (runtime/affinity.py pins it there first), else this machine's
    affinity mask, which Ray's workers inherit. The worker's own check, made before."""
    from hybridflow.workers.rollout.engine import check_tp_cores, engine_pins_cores
    name = str(cfg.rollout.backend)
    if not engine_pins_cores(name) or not runs_on_cpu(cfg):
        return
    from hybridflow.program.placement_checks import allowed_cores
    pool = plan.placement.pools[plan.placement.roles[role]]
    # the first worker's slice, as runtime/affinity.py `cores_for` cuts it (equal slices)
    cores = pool.cores[:len(pool.cores) // pool.devices_per_node] if pool.cores else \
        allowed_cores()
    try:
        check_tp_cores(f"placement.parallel.{role}.tp", tp, cores, name)
    except ValueError as err:
        raise ConfigError(str(err)) from None


def runs_on_cpu(cfg: DictConfig) -> bool:
    """Whether the workers compute on the CPU: `model.device=cpu`, or `auto` where this
    machine has no CUDA device (the workers pick their device the same way)."""
    device = str(cfg.model.device)
    if device not in ("auto", ""):
        return device == "cpu"
    import torch
    return not torch.cuda.is_available()


def check_streaming_layout(cfg: DictConfig, plan: ExecutionPlan) -> None:
    """Streaming needs each rank to decode on its own; an engine whose factory says
    `streams_sharded = False` (the `hf` engine: its ranks decode in lockstep over a
    sharded model) is refused where the model that generates is sharded."""
    from hybridflow.core.modes import AsyncMode
    from hybridflow.workers.rollout.engine import _ENGINES, check_engine_name
    if not AsyncMode.of(cfg.trainer.async_mode).streams:
        return
    name = str(cfg.rollout.backend)
    check_engine_name(name)
    if getattr(_ENGINES.get(name), "streams_sharded", True):
        return
    able = [n for n, f in sorted(_ENGINES.items()) if getattr(f, "streams_sharded", True)]
    where = f"trainer.async_mode=streaming with rollout.backend={name!r}"
    for role in sorted({n.role for n in plan.nodes if n.kind is NodeKind.GENERATE}):
        host = plan.placement.folded.get(role, role)  # whose model generates
        tp = plan.placement.tp_size(host)
        if tp > 1:
            raise ConfigError(
                f"{where}: role '{role}' generates on the tensor-parallel model of role "
                f"'{host}' (placement.parallel.{host}.tp={tp}), whose ranks decode in "
                f"lockstep and cannot stream; use trainer.async_mode=pipeline, tp=1, or an "
                f"engine that streams on sharded models ({', '.join(able) or 'none'})")
        if host != role and RuntimeName.of(cfg.runtime.name).process_per_rank:
            _refuse_fsdp_host(cfg, plan, role, host, where)


def _refuse_fsdp_host(cfg: DictConfig, plan: ExecutionPlan, role: str, host: str,
                      where: str) -> None:
    from hybridflow.workers.backends import BACKENDS
    section = cfg.get(host) if host in cfg else None
    strategy = section.get("strategy") if isinstance(section, DictConfig) else None
    dp, _ = role_layout(plan, host)
    if strategy is None or dp < 2 or not getattr(BACKENDS.get(str(strategy)), "shards", False):
        return
    raise ConfigError(
        f"{where}: role '{role}' is served by role '{host}', whose FSDP model "
        f"({host}.strategy={strategy!r} over {dp} data-parallel ranks) decodes in lockstep "
        f"over its ranks and cannot stream; place '{role}' on a pool of its own "
        f"(placement.roles.{role}=<pool>), or use trainer.async_mode=pipeline")


def _check_plan(cfg: DictConfig, role: str, tp: int) -> None:
    """The tensor-parallel plan the role's workers apply, translated by the worker's own
    code (`tensor_parallel_plan`) on the role's model built on the meta device."""
    if role not in _MODEL_ROLES:
        return
    from hybridflow.workers.parallel.tensor_parallel import tensor_parallel_plan
    key = _ROLE_MODEL_KEYS.get(role)
    path = (OmegaConf.select(cfg, key) if key else None) or cfg.model.path
    try:
        tensor_parallel_plan(_meta_model(cfg, str(path) if path else None))
    except ValueError as err:
        where = f"model.path {path!r}" if path else "model.hf_config"
        raise ConfigError(f"placement.parallel.{role}.tp={tp} ({where}): {err}") from None


def _meta_model(cfg: DictConfig, path: str | None):
    from accelerate import init_empty_weights
    from transformers import AutoModelForCausalLM

    from hybridflow.workers.models import _hf_config, no_loading_bars
    from hybridflow.workers.tokenizer import load_tokenizer, tokenizer_spec
    from transformers.utils import logging as hf_logging
    tokenizer = load_tokenizer(tokenizer_spec(cfg.model))
    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # the config's own warnings are the workers' to say
    try:
        with no_loading_bars(), init_empty_weights(include_buffers=True):
            return AutoModelForCausalLM.from_config(_hf_config(cfg.model, tokenizer, path))
    finally:
        hf_logging.set_verbosity(level)
