"""Each role's peak memory on one device, and each pool's, for a compiled plan.

A role keeps **resident** bytes for the whole run (its weights; AdamW's moments
when it trains) and, during each of its passes, **transient** bytes (gradients,
activations, logits, KV cache, its shard of the batch). Gradients are transient:
the trainer frees them (`zero_grad(set_to_none=True)`) after every optimizer step.

Colocated roles share one process per device and their calls run one at a time, so
a pool's peak is the sum of every role's resident bytes plus the largest transient
of any one pass. Roles on different pools never share a device. A folded role
(a LoRA actor's reference) holds nothing of its own; the HF rollout shares the
actor's module; an engine that reserves its own memory (vLLM: its weights, the fixed
KV cache `rollout.kv_cache_gib` and, on a CPU host, its runtime; `memory/engines.py`)
holds it for the run, or only while it generates where it sleeps (a GPU, colocated).

Tensor parallelism: a rank of a tp group holds its slice of the model
(`model_size.tensor_parallel_slice`) and reads every row of its group.

Engines and training strategies are read through what they declare, never by name: an
engine's `EngineMemory` (`workers/rollout/engine_memory.py`: reserves a device fraction,
records log-probs) and a backend class's `shards` / `gradient_buckets`
(`workers/backends/`).

Shapes: rows per rank = data.batch_size x n / data-parallel ranks; every row is
padded to `data.max_prompt_length + rollout.max_new_tokens` (the engine's layout),
so these are the worst-case figures the run must fit. Stateless.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from hybridflow.core.kinds import NodeKind, Op
from hybridflow.memory.hosts import PoolMemory, pools_memory
from hybridflow.memory.model_size import ModelSize, model_size, tensor_parallel_slice
from hybridflow.memory.passes import (MicroBatch, batch_bytes, generate_pass,
                                      inference_pass, train_pass, training_state)
from hybridflow.memory.role_hooks import (RoleSizing, models_binding, register_role_memory,
                                          role_memory_hook, sized_roles)

__all__ = ["RoleMemory", "PoolMemory", "role_model_size", "actor_pass_memory",
           "critic_pass_memory", "roles_memory", "pools_memory", "register_role_memory"]


@dataclass
class RoleMemory:
    """One role on one device: resident bytes and each pass's transient bytes."""
    role: str
    pool: str
    resident: dict[str, int] = field(default_factory=dict)
    passes: dict[str, dict[str, int]] = field(default_factory=dict)  # "actor.update" -> parts
    notes: list[str] = field(default_factory=list)

    @property
    def resident_bytes(self) -> int:
        return sum(self.resident.values())

    def largest_pass(self) -> tuple[str, int]:
        if not self.passes:
            return "-", 0
        name = max(self.passes, key=lambda n: sum(self.passes[n].values()))
        return name, sum(self.passes[name].values())

    @property
    def peak(self) -> int:
        return self.resident_bytes + self.largest_pass()[1]


def _sections(cfg):
    from hybridflow.workers.config import (ActorConfig, CriticConfig, ModelConfig,
                                           RefConfig, RewardConfig, RolloutConfig,
                                           read_section)
    return {name: read_section(cfg, name, cls) for name, cls in (
        ("model", ModelConfig), ("actor", ActorConfig), ("rollout", RolloutConfig),
        ("ref", RefConfig), ("critic", CriticConfig), ("reward", RewardConfig))}


def _data(cfg) -> tuple[int, int]:
    """(prompts per step, prompt width) from the data section."""
    data = cfg.get("data") if isinstance(cfg, dict) else getattr(cfg, "data", None)
    get = (lambda k, d: data.get(k, d)) if isinstance(data, dict) else \
        (lambda k, d: getattr(data, k, d))
    return int(get("batch_size", 16)), int(get("max_prompt_length", 16))


def role_model_size(cfg, head: str = "causal", path: str | None = None,
                    lora=None, trained: bool = False, tp: int = 1) -> ModelSize:
    """The model a worker of this run builds (from `model.path`, or `model.hf_config`
    with the tokenizer's vocabulary), sized on the meta device; `trained`: with the
    trainer's float32 master weights; `tp`: one rank's slice of a tensor-parallel group."""
    from hybridflow.workers.models import _hf_config, resolve_dtype
    from hybridflow.workers.tokenizer import load_tokenizer, tokenizer_spec
    model_cfg = _sections(cfg)["model"]
    path = model_cfg.path if path is None else path
    tokenizer = None if path is not None and head == "reward" else \
        load_tokenizer(tokenizer_spec(model_cfg))
    config = _hf_config(model_cfg, tokenizer, path)
    return tensor_parallel_slice(
        model_size(config, head, resolve_dtype(model_cfg.dtype), lora, trained), tp)


def actor_pass_memory(cfg, kind: str, rows: int, cuda: bool = False) -> dict[str, int]:
    """Peak bytes of one actor pass ("update", "logprob" or "generate") on `rows`
    rows of one rank, resident state included: what bench/memory.py measures."""
    s = _sections(cfg)
    _, prompt = _data(cfg)
    size = role_model_size(cfg, lora=s["actor"].lora, trained=True)
    kind = actor_pass_kind(kind)
    out = {"weights": size.weight_bytes}
    if kind.trains:  # AdamW allocates its moments at the first step
        out["optimizer"] = training_state(size)["optimizer"]
    out.update(_actor_pass(size, s, kind, rows, prompt,
                           {"cuda": cuda, "shards": 1, "ddp_buckets": False}))
    return out


def micro_rows(rows: int, row_cap: int, budget: int | None, width: int) -> int:
    """Rows of a pass's largest micro-batch: `row_cap` rows, or under a token budget
    (`*max_tokens_per_micro_batch`) the full-width rows that fit in it. Micro-batches
    of shorter rows hold more rows but no more tokens, and activations grow with
    tokens, so this is the peak; a row wider than the budget runs alone."""
    if not budget:
        return min(rows, row_cap)
    return min(rows, max(1, budget // max(1, width)))


def critic_pass_memory(cfg, kind: str, rows: int, cuda: bool = False) -> dict[str, int]:
    """Peak bytes of one critic pass ("update" or "values") on `rows` rows of one
    rank, resident state included: what bench/memory.py measures."""
    s = _sections(cfg)
    _, prompt = _data(cfg)
    size = role_model_size(cfg, head="value", path=s["critic"].path, trained=True)
    response = s["rollout"].max_new_tokens
    micro = MicroBatch(micro_rows(rows, s["critic"].micro_batch_size,
                                  s["critic"].max_tokens_per_micro_batch, prompt + response),
                       prompt, response)
    batch = batch_bytes(rows, prompt, micro.response)
    if kind != "update":
        return {"weights": size.weight_bytes, **inference_pass(size, micro, vocab_head=False),
                "batch": batch}
    return {"weights": size.weight_bytes, "optimizer": training_state(size)["optimizer"],
            **train_pass(size, micro, vocab_head=False, cuda=cuda), "batch": 2 * batch}


def _logit_chunk(setting, size: ModelSize, tp: int = 1) -> int | None:
    """Positions per chunk of log-probs under `setting` (`*.logprob_chunk`), from the
    whole vocabulary (a tp rank's slice times tp), as the worker resolves it."""
    from hybridflow.workers.config import logprob_chunk_positions
    return logprob_chunk_positions(setting, size.arch.vocab * tp)


def _masked(model) -> bool:
    """Whether a training forward's attention keeps a padding mask per layer: not for
    packed rows under sdpa (`model.use_remove_padding`: sdpa_varlen, maskless)."""
    attention = (model.hf_config or {}).get("attn_implementation")
    return not model.use_remove_padding or attention == "eager"


def _actor_pass(size: ModelSize, s, kind: NodeKind, rows: int, prompt: int, state: dict,
                node=None, tp: int = 1, sp: int = 1) -> dict[str, int]:
    response = s["rollout"].max_new_tokens
    temperature = s["rollout"].temperature
    method = node.method if node is not None else ""
    given = (node.kwargs.get("micro_batch_size") if node is not None else None)
    if kind.generates:
        micro = min(rows, s["rollout"].micro_batch_size)
        records = _engine(s).records_log_probs  # one more [rows, vocab] per step
        packed = s["rollout"].prepacked_linear and s["rollout"].backend == "hf"
        return {**generate_pass(size, micro, prompt, response, records, packed),
                "batch": batch_bytes(rows, prompt, response)}
    chunk = _logit_chunk(s["actor"].logprob_chunk, size, tp)
    if kind.trains:
        budget = None if method == "sft" else s["actor"].max_tokens_per_micro_batch
        micro = MicroBatch(micro_rows(rows, given or s["actor"].micro_batch_size, budget,
                                      prompt + response), prompt,
                           response, full_logits=method == "sft", logit_chunk=chunk, sp=sp,
                           masked=_masked(s["model"]))
        return {**train_pass(size, micro, temperature=temperature,
                             checkpointing=s["model"].gradient_checkpointing, **state),
                "batch": 2 * batch_bytes(rows, prompt, response)}  # + the mini-batch copy
    budget = (node.kwargs.get("max_tokens_per_micro_batch") if node is not None else None) \
        or s["rollout"].log_prob_max_tokens_per_micro_batch
    micro = MicroBatch(micro_rows(rows, given or s["rollout"].log_prob_micro_batch_size, budget,
                                  prompt + response), prompt, response, logit_chunk=chunk,
                       sp=sp)
    return {**inference_pass(size, micro, temperature=temperature,
                             prepacked=s["actor"].prepacked_linear),
            "batch": batch_bytes(rows, prompt, response)}


_PASS_KIND = {"update": NodeKind.TRAIN, "logprob": NodeKind.INFERENCE,
              "generate": NodeKind.GENERATE}


def actor_pass_kind(name: str) -> NodeKind:
    """The node kind of an actor pass named as bench/memory.py names it (or a kind)."""
    return NodeKind.of(_PASS_KIND.get(name, name), "an actor pass")


def _calls(plan) -> dict[str, list]:
    """role -> its call nodes in the plan."""
    out: dict[str, list] = {}
    for node in plan.nodes:
        if node.op == Op.CALL and node.role:
            out.setdefault(node.role, []).append(node)
    return out


def _data_parallel(plan, role: str) -> int:
    return plan.placement.layout(role).dp  # core/layout.py; the compiler checked it


def _generate_n(s, calls: dict[str, list]) -> int:
    for node in calls.get("actor", []):
        if node.kind.generates and node.kwargs.get("n") is not None:
            return int(node.kwargs["n"])
    return s["rollout"].n


def roles_memory(cfg, plan, capacity: float | None = None, cuda: bool = False,
                 ) -> list[RoleMemory]:
    """Each role of the plan on one device of its pool, sized by the hook registered
    for it (memory/role_hooks.py); a role without one, or bound to a class its hook
    does not size (e.g. a user's worker class), comes back with a note and no bytes."""
    s = _agent_widths(_sections(cfg), cfg, plan)
    calls = _calls(plan)
    n = _generate_n(s, calls)
    _, prompt = _data(cfg)
    out = []
    for role in sorted(calls):
        dp = _data_parallel(plan, role)
        rows = max(1, math.ceil(_data(cfg)[0] * n / dp))
        memory = RoleMemory(role, plan.placement.roles.get(role, "?"))
        if role in plan.placement.folded:
            memory.notes.append(f"served by {plan.placement.folded[role]}'s worker in "
                                "the same process: no weights of its own")
        if not models_binding(role, plan.bindings.get(role)):
            memory.notes.append("not modeled (a worker class of its own)")
        else:
            layout = plan.placement.layout(role)
            job = RoleSizing(cfg, s, calls[role], rows, prompt, capacity,
                             folded=role in plan.placement.folded,
                             state=_layout(s, role, dp, cuda), tp=layout.tp, sp=layout.sp)
            try:
                role_memory_hook(role)(memory, job)
            except (OSError, ValueError) as err:  # e.g. a model path of another machine
                memory.notes.append(f"not counted: {err}")
        out.append(memory)
    return out


def _agent_widths(s: dict, cfg, plan) -> dict:
    """An agent rollout lays its episodes out `agent.max_response_tokens` wide (the
    model's turns and the observations), not `rollout.max_new_tokens` (one turn's
    sampling budget): every pass over its batch is that wide (issue 26: ~4x under)."""
    from dataclasses import replace

    from hybridflow.agents.worker import episode_width
    width = episode_width(cfg, plan)
    if width is None:
        return s
    return {**s, "rollout": replace(s["rollout"], max_new_tokens=width)}


def _layout(s, role: str, dp: int, cuda: bool) -> dict:
    """How a trained role keeps its state: FSDP2 shards weights, gradients and
    moments over the data-parallel ranks; DDP over several ranks adds its gradient
    buckets."""
    from hybridflow.workers.backends import BACKENDS, TrainingBackend
    backend = BACKENDS.get(getattr(s.get(role), "strategy", "ddp"), TrainingBackend)
    return {"cuda": cuda, "shards": dp if backend.shards else 1,
            "ddp_buckets": backend.gradient_buckets and dp > 1}


def _engine(s):
    """What `rollout.backend`'s engine declares it holds on a device."""
    from hybridflow.workers.rollout.engine_memory import engine_memory
    return engine_memory(s["rollout"].backend)


def _resident(size: ModelSize, state: dict, trained: bool = True) -> dict[str, int]:
    """Weights (a shard of them under FSDP2) and, for a trained role, AdamW's moments."""
    out = {"weights": size.weight_bytes // state["shards"]}
    if trained:
        out["optimizer"] = training_state(size, **state)["optimizer"]
    return out


def _size_actor(memory: RoleMemory, job: RoleSizing) -> None:
    s, state, tp = job.sections, job.state, job.tp
    size = role_model_size(job.cfg, lora=s["actor"].lora, trained=True, tp=tp)
    memory.resident = _resident(size, state)
    for node in job.nodes:
        name = f"actor.{node.method}"
        if node.kind.generates and _engine(s).reserves_device:
            _engine_bytes(memory, name, job.cfg, s, job.capacity, state["cuda"], True, tp)
        else:
            memory.passes[name] = _actor_pass(size, s, node.kind, job.rows, job.prompt,
                                              state, node, tp, job.sp)


def _size_ref(memory: RoleMemory, job: RoleSizing) -> None:
    s, folded, tp, rows, prompt = job.sections, job.folded, job.tp, job.rows, job.prompt
    response = s["rollout"].max_new_tokens
    size = role_model_size(job.cfg, path=s["ref"].path, lora=s["actor"].lora if folded
                           else None, trained=folded, tp=tp)
    if not folded:
        memory.resident = {"weights": size.weight_bytes}
    micro = MicroBatch(micro_rows(rows, s["ref"].micro_batch_size,
                                  s["ref"].max_tokens_per_micro_batch, prompt + response),
                       prompt, response, logit_chunk=_logit_chunk(s["ref"].logprob_chunk,
                                                                  size, tp), sp=job.sp)
    packed = s["ref"].prepacked_linear and not folded  # a folded ref packs nothing
    for node in job.nodes:
        memory.passes[f"ref.{node.method}"] = {
            **inference_pass(size, micro, temperature=s["rollout"].temperature,
                             prepacked=packed), "batch": batch_bytes(rows, prompt, response)}


def _size_critic(memory: RoleMemory, job: RoleSizing) -> None:
    s, state, rows, prompt = job.sections, job.state, job.rows, job.prompt
    response = s["rollout"].max_new_tokens
    size = role_model_size(job.cfg, head="value", path=s["critic"].path, trained=True,
                           tp=job.tp)
    memory.resident = _resident(size, state)
    micro = MicroBatch(micro_rows(rows, s["critic"].micro_batch_size,
                                  s["critic"].max_tokens_per_micro_batch, prompt + response),
                       prompt, response, sp=job.sp, masked=_masked(s["model"]))
    for node in job.nodes:
        trains = node.kind.trains
        parts = train_pass(size, micro, vocab_head=False,
                           checkpointing=s["model"].gradient_checkpointing, **state) \
            if trains else inference_pass(size, micro, vocab_head=False)
        memory.passes[f"critic.{node.method}"] = {
            **parts, "batch": (2 if trains else 1) * batch_bytes(rows, prompt, response)}


def _size_rollout(memory: RoleMemory, job: RoleSizing) -> None:
    """Colocated with the actor it generates with the actor's engine and module
    (adapters included); on a pool of its own it holds an engine with its own copy
    of the initial weights (no adapters)."""
    cfg, s, folded, state, tp = job.cfg, job.sections, job.folded, job.state, job.tp
    size = role_model_size(cfg, lora=s["actor"].lora if folded else None, trained=folded,
                           tp=tp)
    if not folded and not _engine(s).reserves_device:
        memory.resident = {"weights": size.weight_bytes}
    for node in job.nodes:
        name = f"rollout.{node.method}"
        if not node.kind.generates:
            continue  # load_weights: buckets of the actor's export, small
        if _engine(s).reserves_device:
            _engine_bytes(memory, name, cfg, s, job.capacity, state["cuda"], folded, tp)
        else:
            memory.passes[name] = _actor_pass(size, s, NodeKind.GENERATE, job.rows,
                                              job.prompt, {**state, "shards": 1})


def _size_reward(memory: RoleMemory, job: RoleSizing) -> None:
    s, rows, prompt = job.sections, job.rows, job.prompt
    path = s["reward"].model_path
    if not path:
        memory.notes.append("rule-based scores: no model")
        return
    import os
    if not os.path.isdir(path):
        memory.notes.append(f"reward.model_path {path!r} is not a directory here: "
                            "its model is not counted")
        return
    size = role_model_size(job.cfg, head="reward", path=path)
    memory.resident = {"weights": size.weight_bytes}
    response = s["rollout"].max_new_tokens
    micro = MicroBatch(min(rows, s["reward"].micro_batch_size), prompt, response)
    for node in job.nodes:
        memory.passes[f"reward.{node.method}"] = {
            **inference_pass(size, micro, vocab_head=False),
            "batch": batch_bytes(rows, prompt, response)}


def _engine_bytes(memory: RoleMemory, name: str, cfg, s, capacity: float | None,
                  cuda: bool, colocated: bool, tp: int) -> None:
    """An engine that reserves its own memory (vLLM, `memory/engines.py`): resident,
    or the pass's bytes where it sleeps between generations; counted once per role."""
    from hybridflow.memory.engines import engine_parts, engine_sleeps
    weights = role_model_size(cfg, tp=tp).weight_bytes  # its own copy, one tp slice
    parts = engine_parts(s, _engine(s), weights, capacity, cuda, memory.notes)
    if any(note.startswith("served by") for note in memory.notes):
        memory.notes = [n for n in memory.notes if not n.startswith("served by")] + [
            "served by the actor's worker in the same process; its engine holds a copy "
            "of the weights of its own"]
    if engine_sleeps(s, cuda, colocated):
        memory.passes[name] = parts
    else:  # resident: one engine, however many calls generate with it
        memory.resident.update(parts)
        memory.passes[name] = {}


for _role, _hook in (("actor", _size_actor), ("rollout", _size_rollout), ("ref", _size_ref),
                     ("critic", _size_critic), ("reward", _size_reward)):
    if _role not in sized_roles():  # a hook registered before this import stays
        register_role_memory(_role, _hook)
