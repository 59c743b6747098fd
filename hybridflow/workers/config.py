"""Typed config sections read by the role workers.

Each dataclass is one section of the run's structured config (`model`, `actor`,
`rollout`, `ref`, `critic`, `reward`); `hybridflow/program/config.py` composes them.
`hybridflow.program.assemble.prepare` builds the run config once and converts it to typed
values once (`config.run_values`); a worker receives those values and takes its
sections with `read_section` (which returns an already-typed section as it is, and
still converts a dict for workers built by hand in tests).

Each field declares its allowed values with `checked(default, rule)` (see
`hybridflow/core/constraints.py`); `build_config` checks them all before launch. Names
that belong to code outside the engine are checked against registries: training
strategies against `workers/backends`, rollout engines against theirs, and the
default losses' names (policy loss, KL kind, aggregation mode, off-policy
correction) against `LOSS_SETTING_NAMES`, the module state that the loss providers
fill on import.

Batch sizes count *rows* (responses, i.e. prompts x n) over the whole worker
group: a mini-batch of 16 on 2 data-parallel ranks is 8 rows on each. A
`*max_tokens_per_micro_batch` (None: off) counts padded tokens per rank and, when
set, replaces the row count of micro-batches (`workers/micro_batches.py`); under
`model.use_remove_padding` it counts real tokens (the rows' summed lengths).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from hybridflow.core.constraints import (Rule, above, at_least, checked, in_range, one_of,
                                         pair_in_range, probability)
from hybridflow.core.names import named_object
from hybridflow.core.sections import read_section
from hybridflow.workers.scoring import DEFAULT_SCORER_TABLE

__all__ = ["ModelConfig", "LoraConfig", "ActorConfig", "RolloutConfig", "RefConfig",
           "CriticConfig", "RewardConfig", "read_section", "DEFAULT_HF_CONFIG",
           "register_setting_names", "setting_names", "AUTO_LOGPROB_CHUNK_ELEMENTS",
           "logprob_chunk_positions"]

# A tiny Llama for the toy task: big enough to learn arithmetic formats, small
# enough that a CPU test runs an update in well under a second.
DEFAULT_HF_CONFIG: dict[str, Any] = {
    "model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
    "max_position_embeddings": 256, "rms_norm_eps": 1e-6, "tie_word_embeddings": False,
}


_DEVICE = Rule(lambda v: v in ("auto", "cpu", "cuda") or str(v).startswith("cuda:"),
               "be 'auto', 'cpu', 'cuda' or 'cuda:<index>'")
# Names a default loss understands ("policy loss" -> ("cispo", "gspo", "ppo"), "KL
# kind", "loss aggregation mode"): registered by the module that holds that math
# (graphs/ops.py, one of hybridflow.graph.loss.DEFAULT_LOSS_PROVIDERS), so the engine names
# none of them and still refuses a typo before launch.
LOSS_SETTING_NAMES: dict[str, tuple[str, ...]] = {}


# `*.logprob_chunk=None`: a chunk of as many positions as make 2**24 float32 logits
# (64 MiB; a 49k vocabulary: 341 positions, 152k: 110), so the toy's 80-token
# vocabulary never chunks (workers/chunked_logprobs.py; memory/passes.py sizes it)
AUTO_LOGPROB_CHUNK_ELEMENTS = 1 << 24


def logprob_chunk_positions(setting: int | None, vocab: int) -> int | None:
    """Positions per chunk of log-probs under `*.logprob_chunk` = `setting` for a
    vocabulary of `vocab` entries; None: never chunk (0)."""
    if setting == 0:
        return None
    return int(setting) if setting else max(1, AUTO_LOGPROB_CHUNK_ELEMENTS // max(1, vocab))


def register_setting_names(what: str, names) -> None:
    """Make the config fields checked as `what` accept exactly `names`."""
    LOSS_SETTING_NAMES[what] = tuple(names)


def setting_names(what: str) -> tuple[str, ...]:
    """The names registered as `what`, importing the default loss providers by name
    first when none are registered yet; () when no provider registers any."""
    if what not in LOSS_SETTING_NAMES:
        import importlib

        from hybridflow.graph.loss import DEFAULT_LOSS_PROVIDERS
        for module in DEFAULT_LOSS_PROVIDERS:
            importlib.import_module(module)
    return LOSS_SETTING_NAMES.get(what, ())


def _registered(what: str, names, how_to_add: str = "") -> Rule:
    """One of the names `names()` returns at check time (a registry others fill);
    the message suggests the closest. No names registered: anything goes (no one
    reads the value)."""
    def test(value) -> bool:
        valid = names()
        return not valid or value in valid

    def message(key: str, value) -> str:
        return one_of(*names(), what=what).message(key, value) + how_to_add
    return Rule(test, f"be a registered {what}", message=message)


def _backend_names() -> tuple[str, ...]:
    from hybridflow.workers.backends import BACKENDS  # imports torch: only when checking
    return tuple(sorted(BACKENDS))


_STRATEGY = _registered("training strategy", _backend_names,
                        "; a new one registers with hybridflow.workers.backends."
                        "register_backend(name, cls)")
_POLICY_LOSS = _registered("policy loss", lambda: setting_names("policy loss"))
_KL_KIND = _registered("KL kind", lambda: setting_names("KL kind"))
_AGG_MODE = _registered("loss aggregation mode",
                        lambda: setting_names("loss aggregation mode"))
_OFF_POLICY = _registered("off-policy correction",
                          lambda: setting_names("off-policy correction"))
_IS_LEVEL = one_of("token", "sequence", what="importance-sampling level")
_LR_SCHEDULE = one_of("constant", "cosine", what="lr schedule")


def _engine_problem(name: Any) -> str | None:
    """Why `name` is no rollout engine (None: it is one). The registry lives with the
    engines (hybridflow/workers/rollout/engine.py); imported here only when checking."""
    from hybridflow.workers.rollout.engine import check_engine_name
    try:
        check_engine_name(str(name))
    except ValueError as err:
        return str(err)
    return None


_ENGINE = Rule(lambda v: _engine_problem(v) is None, "be a registered rollout engine",
               message=lambda key, value: _engine_problem(value))


@dataclass
class ModelConfig:
    path: Optional[str] = None            # local HF model dir; None builds from hf_config
    hf_config: dict = field(default_factory=lambda: dict(DEFAULT_HF_CONFIG))
    tokenizer: str = "char"               # "char" (built in code) or a local dir
    dtype: str = "float32"                # "float32" | "bfloat16" | "auto" (bf16 where native)
    device: str = checked("auto", _DEVICE)
    gradient_checkpointing: bool = False
    # packed sequences (workers/packing.py): the actor's log-prob and update, the
    # reference's log-prob and the critic's values and update run each micro-batch as
    # one row of its real tokens, no pad tokens; a token budget then counts real tokens
    use_remove_padding: bool = False


@dataclass
class LoraConfig:
    rank: int = checked(0, at_least(0))   # 0 = off
    alpha: int = checked(16, above(0))
    dropout: float = checked(0.0, in_range(0, 1, open_high=True))
    target_modules: list = field(default_factory=lambda: ["q_proj", "k_proj", "v_proj",
                                                           "o_proj"])


@dataclass
class ActorConfig:
    lr: float = checked(1e-6, at_least(0))
    weight_decay: float = checked(0.01, at_least(0))
    betas: list = checked(rule=pair_in_range(0, 1), factory=lambda: [0.9, 0.999])
    warmup_steps: int = checked(0, at_least(0))
    lr_schedule: str = checked("constant", _LR_SCHEDULE)
    min_lr_ratio: float = checked(0.0, probability)  # cosine floor, as a fraction of lr
    total_steps: int = checked(1000, at_least(1))    # optimizer steps the cosine spans
    ppo_epochs: int = checked(1, at_least(1))
    mini_batch_size: int = checked(256, at_least(1))  # rows per optimizer step, whole group
    micro_batch_size: int = checked(8, at_least(1))   # rows per forward/backward, per rank
    # set: micro-batches by padded tokens (rows x longest row) per rank, not by rows
    max_tokens_per_micro_batch: Optional[int] = checked(None, at_least(1))
    grad_clip: float = checked(1.0, above(0))
    policy_loss: str = checked("ppo", _POLICY_LOSS)  # names: graphs/ops.py registers them
    clip_low: float = checked(0.2, at_least(0))
    clip_high: float = checked(0.2, at_least(0))
    clip_c: float = checked(3.0, above(1))  # dual-clip bound: a lower bound above 1
    loss_agg_mode: str = checked("token-mean", _AGG_MODE)
    use_kl_loss: bool = False
    kl_loss_coef: float = checked(0.001, at_least(0))
    kl_loss_type: str = checked("low_var_kl", _KL_KIND)
    entropy_coeff: float = 0.0
    # samples from other weights (trainer.staleness >= 1) or another engine: "none",
    # "tis" or "decoupled" (names: graphs/ops.py registers them; docs/algorithms.md)
    off_policy: str = checked("none", _OFF_POLICY)
    is_level: str = checked("token", _IS_LEVEL)  # "sequence": one weight a response (tis)
    is_cap: float = checked(2.0, above(1))       # tis truncates at it, decoupled drops above
    # the loss's old_log_probs: "recompute" (actor.logprob's, the trainer's forward) or
    # "rollout" (the engine's rollout_log_probs; actor.logprob is then removed)
    old_log_probs: str = checked("recompute", one_of("recompute", "rollout",
                                                     what="old log-probs source"))
    shuffle: bool = False
    strategy: str = checked("ddp", _STRATEGY)  # "fsdp2": CUDA (nccl) or CPU (gloo)
    # log-probs and entropy (update, logprob, sft) a chunk of this many positions at a
    # time, never a micro-batch's whole logits (workers/chunked_logprobs.py); None: as
    # many as keep a chunk's float32 logits under 64 MiB; 0: never chunk
    logprob_chunk: Optional[int] = checked(None, at_least(0))
    # a CPU at fp32: the `logprob` pass (old log-probs, no grad) runs the linear layers
    # through oneDNN with the current weights prepacked once a call, as
    # ref.prepacked_linear (workers/rollout/prepacked.py); the update is left alone
    prepacked_linear: bool = False
    lora: LoraConfig = field(default_factory=LoraConfig)


@dataclass
class RolloutConfig:
    backend: str = checked("hf", _ENGINE)  # "hf" | "vllm" | registered | "module:factory"
    n: int = checked(1, at_least(1))
    temperature: float = checked(1.0, above(0))
    top_p: float = checked(1.0, in_range(0, 1, open_low=True))
    top_k: int = checked(-1, at_least(-1))  # -1 (or 0) = off
    max_new_tokens: int = checked(16, at_least(1))
    do_sample: bool = True
    micro_batch_size: int = checked(64, at_least(1))            # rows per HF generate call
    # `hf` engine only: "own" decodes with workers/rollout/hf_decode.py (the default);
    # "generate" with HF `generate`, drawing the tokens a seed drew before that loop
    # (kept for one release, to reproduce earlier runs; docs/workers.md)
    hf_loop: str = checked("own", one_of("own", "generate", what="hf decode loop"))
    # `hf` engine only, a CPU at fp32: generate runs its linear layers through oneDNN
    # with the weights prepacked once a call (workers/rollout/prepacked.py; one more
    # copy of the weights meanwhile; tokens differ from F.linear's in the last bits)
    prepacked_linear: bool = False
    log_prob_micro_batch_size: int = checked(16, at_least(1))   # rows per forward in logprob
    log_prob_max_tokens_per_micro_batch: Optional[int] = checked(None, at_least(1))
    gpu_memory_utilization: float = checked(0.5, in_range(0, 1, open_low=True))  # vllm only
    enable_sleep_mode: bool = True        # vllm only, where its platform has sleep mode
    # vllm only: the KV cache's size (vLLM's kv_cache_memory_bytes), on every platform;
    # 0 = vLLM sizes it from gpu_memory_utilization (on the CPU: a share of host RAM)
    kv_cache_gib: float = checked(1.0, at_least(0))
    enforce_eager: bool = False           # vllm only: no CUDA graphs / torch.compile
    max_model_len: int = checked(0, at_least(0))  # vllm only; 0 = the model's max positions
    # vllm only: the most sequences one vLLM step decodes (vLLM's max_num_seqs; the
    # `hf` engine's streaming slots are micro_batch_size); 0 = vLLM's own default
    max_num_seqs: int = checked(0, at_least(0))
    weight_bucket_mb: float = checked(256.0, above(0))  # weights reach an engine in buckets
    # trainer.async_mode=streaming: a generation running when new weights land continues
    # with them (each token keeps its version and log-prob) or is aborted and re-queued
    partial: bool = True
    # trainer.async_mode=streaming, run inline (local runtime): decode steps per look at
    # the buffer (the fixed interleaving of decoding and training)
    stream_poll_steps: int = checked(4, at_least(1))


@dataclass
class RefConfig:
    micro_batch_size: int = checked(16, at_least(1))
    max_tokens_per_micro_batch: Optional[int] = checked(None, at_least(1))
    path: Optional[str] = None            # None: the initial policy (model section)
    logprob_chunk: Optional[int] = checked(None, at_least(0))  # as actor.logprob_chunk
    # a CPU at fp32, the reference's own model: its linear layers run through oneDNN
    # with the weights prepacked once a call (workers/rollout/prepacked.py, as
    # rollout.prepacked_linear; one more copy of the weights during the call;
    # log-probs differ from F.linear's in the last bits)
    prepacked_linear: bool = False


@dataclass
class CriticConfig:
    path: Optional[str] = None            # None: backbone from the model section
    lr: float = checked(1e-5, at_least(0))
    weight_decay: float = checked(0.01, at_least(0))
    betas: list = checked(rule=pair_in_range(0, 1), factory=lambda: [0.9, 0.999])
    warmup_steps: int = checked(0, at_least(0))
    lr_schedule: str = checked("constant", _LR_SCHEDULE)
    min_lr_ratio: float = checked(0.0, probability)
    total_steps: int = checked(1000, at_least(1))
    cliprange_value: float = checked(0.5, at_least(0))
    loss_agg_mode: str = checked("token-mean", _AGG_MODE)
    ppo_epochs: int = checked(1, at_least(1))
    mini_batch_size: int = checked(256, at_least(1))
    micro_batch_size: int = checked(8, at_least(1))
    max_tokens_per_micro_batch: Optional[int] = checked(None, at_least(1))  # values, update
    grad_clip: float = checked(1.0, above(0))
    shuffle: bool = False
    strategy: str = checked("ddp", _STRATEGY)


@dataclass
class RewardConfig:
    function_path: Optional[str] = None   # a .py file or module holding a user scorer
    function_name: str = "compute_score"
    model_path: Optional[str] = None      # local reward model dir (sequence classification)
    micro_batch_size: int = checked(16, at_least(1))  # reward model rows per forward
    num_workers: int = checked(0, at_least(0))        # >0: rule scoring in a process pool
    timeout_s: float = checked(30.0, above(0))        # per sample, in this process or the pool
    # a scorer that times out on this many samples in a row is stuck: the step fails
    # (the batch is bounded: at most this many x timeout_s, not rows x timeout_s); 0: never
    max_consecutive_timeouts: int = checked(3, at_least(0))
    kwargs: dict[str, Any] = field(default_factory=dict)  # to the scorer, by keyword
    # name -> {function_path, function_name, weight, kwargs}: a weighted sum of named
    # scorers (function_path null: the table's); replaces the single scorer above
    scorers: dict[str, Any] = field(default_factory=dict)
    # without function_path: "package.module:NAME" of a mapping data_source -> scorer
    scorer_table: str = checked(DEFAULT_SCORER_TABLE, named_object("a scorer table"))
