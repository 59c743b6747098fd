"""Each role's peak memory on one device, and each pool's, for a compiled plan.

A role keeps **resident** bytes for the whole run (its weights; AdamW's moments
when it trains) and, during each of its passes, **transient** bytes (gradients,
activations, logits, KV cache, its shard of the batch). Gradients are transient:
the trainer frees them (`zero_grad(set_to_none=True)`) after every optimizer step.

Colocated roles share one process per device and their calls run one at a time, so
a pool's peak is the sum of every role's resident bytes plus the largest transient
of any one pass. Roles on different pools never share a device. A folded role
(a LoRA actor's reference) holds nothing of its own; the HF rollout shares the
actor's module; a vLLM engine reserves `gpu_memory_utilization` of the device while
it generates (with sleep mode it frees it for the rest of the step).

Shapes: rows per rank = data.batch_size x n / data-parallel ranks; every row is
padded to `data.max_prompt_length + rollout.max_new_tokens` (the engine's layout),
so these are the worst-case figures the run must fit. Stateless.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from hybridflow.memory.model_size import ModelSize, model_size
from hybridflow.memory.passes import (MicroBatch, batch_bytes, generate_pass,
                                      inference_pass, train_pass, training_state)

__all__ = ["RoleMemory", "PoolMemory", "role_model_size", "actor_pass_memory",
           "roles_memory", "pools_memory"]

MODELED_ROLES = ("actor", "ref", "critic", "reward")


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


@dataclass
class PoolMemory:
    """Colocated roles on one device of a pool: resident bytes summed, plus the
    largest pass of any of them (calls on one process run one at a time)."""
    pool: str
    roles: list[RoleMemory]
    capacity: float | None  # bytes per device, when the device is known

    @property
    def peak(self) -> int:
        passes = [r.largest_pass() for r in self.roles]
        return sum(r.resident_bytes for r in self.roles) + max((b for _, b in passes), default=0)

    def peak_pass(self) -> str:
        passes = [r.largest_pass() for r in self.roles]
        return max(passes, key=lambda p: p[1], default=("-", 0))[0]

    @property
    def fits(self) -> bool:
        return self.capacity is None or self.peak <= self.capacity


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
                    lora=None) -> ModelSize:
    """The model a worker of this run builds (from `model.path`, or `model.hf_config`
    with the tokenizer's vocabulary), sized on the meta device."""
    from hybridflow.workers.models import _hf_config, resolve_dtype
    from hybridflow.workers.tokenizer import load_tokenizer, tokenizer_spec
    model_cfg = _sections(cfg)["model"]
    path = model_cfg.path if path is None else path
    tokenizer = None if path is not None and head == "reward" else \
        load_tokenizer(tokenizer_spec(model_cfg))
    config = _hf_config(model_cfg, tokenizer, path)
    return model_size(config, head, resolve_dtype(model_cfg.dtype), lora)


def actor_pass_memory(cfg, kind: str, rows: int, cuda: bool = False) -> dict[str, int]:
    """Peak bytes of one actor pass ("update", "logprob" or "generate") on `rows`
    rows of one rank, resident state included: what bench/memory.py measures."""
    s = _sections(cfg)
    _, prompt = _data(cfg)
    size = role_model_size(cfg, lora=s["actor"].lora)
    kind = actor_pass_kind(kind)
    out = {"weights": size.weight_bytes}
    if kind == "train":  # AdamW allocates its moments at the first step
        out["optimizer"] = training_state(size)["optimizer"]
    out.update(_actor_pass(size, s, kind, rows, prompt, cuda))
    return out


def _actor_pass(size: ModelSize, s, kind: str, rows: int, prompt: int,
                cuda: bool, method: str = "") -> dict[str, int]:
    response = s["rollout"].max_new_tokens
    temperature = s["rollout"].temperature
    if kind == "generate":
        micro = min(rows, s["rollout"].micro_batch_size)
        return {**generate_pass(size, micro, prompt, response),
                "batch": batch_bytes(rows, prompt, response)}
    if kind == "train":
        micro = MicroBatch(min(rows, s["actor"].micro_batch_size), prompt, response,
                           full_logits=method == "sft")
        return {**train_pass(size, micro, temperature=temperature, cuda=cuda,
                             checkpointing=s["model"].gradient_checkpointing),
                "batch": 2 * batch_bytes(rows, prompt, response)}  # + the mini-batch copy
    micro = MicroBatch(min(rows, s["rollout"].log_prob_micro_batch_size), prompt, response)
    return {**inference_pass(size, micro, temperature=temperature),
            "batch": batch_bytes(rows, prompt, response)}


_PASS_KIND = {"update": "train", "logprob": "inference", "generate": "generate"}


def actor_pass_kind(name: str) -> str:
    return _PASS_KIND.get(name, name)
