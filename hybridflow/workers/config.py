"""Typed config sections read by the role workers.

Each dataclass is one section of the run's structured config (`model`, `actor`,
`rollout`, `ref`, `critic`, `reward`); `hybridflow/config.py` composes them.
A worker turns the run config into these values once, in its constructor, with
`read_section`, and passes the values down; nothing else reads the raw config.

Batch sizes count *rows* (responses, i.e. prompts x n) over the whole worker
group: a mini-batch of 16 on 2 data-parallel ranks is 8 rows on each.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Optional

__all__ = ["ModelConfig", "LoraConfig", "ActorConfig", "RolloutConfig", "RefConfig",
           "CriticConfig", "RewardConfig", "read_section", "DEFAULT_HF_CONFIG"]

# A tiny Llama for the toy task: big enough to learn arithmetic formats, small
# enough that a CPU test runs an update in well under a second.
DEFAULT_HF_CONFIG: dict[str, Any] = {
    "model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
    "max_position_embeddings": 256, "rms_norm_eps": 1e-6, "tie_word_embeddings": False,
}


@dataclass
class ModelConfig:
    path: Optional[str] = None            # local HF model dir; None builds from hf_config
    hf_config: dict = field(default_factory=lambda: dict(DEFAULT_HF_CONFIG))
    tokenizer: str = "char"               # "char" (built in code) or a local dir
    dtype: str = "float32"                # "float32" | "bfloat16"
    device: str = "auto"                  # "auto" | "cpu" | "cuda"
    gradient_checkpointing: bool = False


@dataclass
class LoraConfig:
    rank: int = 0                         # 0 = off
    alpha: int = 16
    dropout: float = 0.0
    target_modules: list = field(default_factory=lambda: ["q_proj", "k_proj", "v_proj",
                                                           "o_proj"])


@dataclass
class ActorConfig:
    lr: float = 1e-6
    weight_decay: float = 0.01
    betas: list = field(default_factory=lambda: [0.9, 0.999])
    warmup_steps: int = 0
    lr_schedule: str = "constant"         # "constant" | "cosine"
    min_lr_ratio: float = 0.0             # cosine floor, as a fraction of lr
    total_steps: int = 1000               # optimizer steps the cosine schedule spans
    ppo_epochs: int = 1
    mini_batch_size: int = 256            # rows per optimizer step, whole group
    micro_batch_size: int = 8             # rows per forward/backward, per rank
    grad_clip: float = 1.0
    policy_loss: str = "ppo"
    clip_low: float = 0.2
    clip_high: float = 0.2
    clip_c: float = 3.0
    loss_agg_mode: str = "token-mean"
    use_kl_loss: bool = False
    kl_loss_coef: float = 0.001
    kl_loss_type: str = "low_var_kl"
    entropy_coeff: float = 0.0
    shuffle: bool = False
    strategy: str = "ddp"                 # "ddp" | "fsdp2" (GPU only)
    lora: LoraConfig = field(default_factory=LoraConfig)


@dataclass
class RolloutConfig:
    backend: str = "hf"                   # "hf" | "vllm" | registered | "module:factory"
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1                       # -1 = off
    max_new_tokens: int = 16
    do_sample: bool = True
    micro_batch_size: int = 64            # rows per HF generate call
    log_prob_micro_batch_size: int = 16   # rows per forward in actor.logprob
    gpu_memory_utilization: float = 0.5   # vllm only
    enable_sleep_mode: bool = True        # vllm only
    max_model_len: int = 0                # vllm only; 0 = the model's max positions
    weight_bucket_mb: float = 256.0       # weights move to an engine in buckets this big


@dataclass
class RefConfig:
    micro_batch_size: int = 16
    path: Optional[str] = None            # None: the initial policy (model section)


@dataclass
class CriticConfig:
    path: Optional[str] = None            # None: backbone from the model section
    lr: float = 1e-5
    weight_decay: float = 0.01
    betas: list = field(default_factory=lambda: [0.9, 0.999])
    warmup_steps: int = 0
    lr_schedule: str = "constant"
    min_lr_ratio: float = 0.0
    total_steps: int = 1000
    cliprange_value: float = 0.5
    loss_agg_mode: str = "token-mean"
    ppo_epochs: int = 1
    mini_batch_size: int = 256
    micro_batch_size: int = 8
    grad_clip: float = 1.0
    shuffle: bool = False
    strategy: str = "ddp"


@dataclass
class RewardConfig:
    function_path: Optional[str] = None   # a .py file or module holding a user scorer
    function_name: str = "compute_score"
    model_path: Optional[str] = None      # local reward model dir (sequence classification)
    micro_batch_size: int = 16            # reward model rows per forward
    num_workers: int = 0                  # >0: rule scoring in a process pool
    timeout_s: float = 30.0               # per sample, process pool only


def _as_plain(value: Any) -> Any:
    try:
        from omegaconf import DictConfig, ListConfig, OmegaConf
        if isinstance(value, (DictConfig, ListConfig)):
            return OmegaConf.to_container(value, resolve=True)
    except ImportError:  # pragma: no cover - omegaconf is a dependency
        pass
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    return value


def _build(cls, values: dict, where: str):
    known = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - set(known))
    if unknown:
        raise ValueError(f"config section '{where}' has unknown key(s) {unknown}; "
                         f"known keys: {sorted(known)}")
    kwargs = {}
    for name, value in values.items():
        sub = known[name].default_factory if known[name].default_factory \
            is not dataclasses.MISSING else None
        if isinstance(value, dict) and sub is not None and dataclasses.is_dataclass(sub):
            value = _build(sub, value, f"{where}.{name}")
        kwargs[name] = value
    return cls(**kwargs)


def read_section(cfg: Any, name: str, cls):
    """`cfg.<name>` (DictConfig, dict, dataclass or absent) as an instance of `cls`."""
    if isinstance(cfg, dict) or cfg is None:
        section = (cfg or {}).get(name)
    else:
        section = getattr(cfg, name, None)
    if section is None:
        return cls()
    if isinstance(section, cls):
        return section
    section = _as_plain(section)
    if not isinstance(section, dict):
        raise TypeError(f"config section '{name}' must be a mapping, got "
                        f"{type(section).__name__}")
    return _build(cls, section, name)
