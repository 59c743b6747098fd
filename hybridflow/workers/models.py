"""Building Hugging Face models: causal LM (policy, reference), value model, reward model.

A model comes from a local directory (`from_pretrained`) or from a config dict
(`hf_config`, the tiny default for tests and the toy task). Building from a config
is seeded, so every data-parallel rank, and the reference beside the actor, starts
from exactly the same weights without any broadcast. Under `model.use_remove_padding`
a model with sdpa attention gets `sdpa_varlen` (`varlen_attention.py`).

Tensor parallelism (`tp_mesh`, the role's "tp" mesh dim, `role_tp_mesh`): a model from a
directory with safetensors is built shard by shard (`parallel/shard_build.py`: on the meta device,
sharded, then each rank reads only its rows or columns), so no rank holds the whole
model; a model from a config (seeded) or from a directory of `.bin` files is built whole
and then sharded (`parallel/tensor_parallel.parallelize`). State: none.
"""
from __future__ import annotations

import os
from contextlib import contextmanager

import torch

from hybridflow.core.dtensor import local_shard
from hybridflow.workers.config import ModelConfig
from hybridflow.workers.tokenizer import require_local_dir

__all__ = [
    "ModelLoadError",
    "build_causal_lm",
    "build_reward_model",
    "build_value_model",
    "check_loading_info",
    "model_bytes",
    "resolve_device",
    "resolve_dtype", "native_bf16",
    "role_tp_mesh",
    "token_ids_from_tokenizer",
    "TOKEN_ID_KEYS",
]


class ModelLoadError(ValueError):
    """A model directory whose weights do not match its config.json (missing,
    unexpected or differently shaped tensors); names the directory and the tensors."""


_SHOWN = 6  # tensors listed per kind of problem


def _listed(names: list[str]) -> str:
    names = sorted(names)
    more = f", ... ({len(names) - _SHOWN} more)" if len(names) > _SHOWN else ""
    return ", ".join(names[:_SHOWN]) + more


def check_loading_info(path: str, info: dict, may_miss: tuple[str, ...] = (),
                       may_leave: tuple[str, ...] = ()) -> None:
    """Raise ModelLoadError unless every weight of the model came from `path` with its
    shape and every tensor there was used; `may_miss`/`may_leave` are name prefixes
    allowed to be missing (a new head) or left over (a head not used)."""
    missing = [k for k in info.get("missing_keys", ()) if not k.startswith(may_miss)]
    unexpected = [k for k in info.get("unexpected_keys", ()) if not k.startswith(may_leave)]
    mismatched = [f"{name} (checkpoint {tuple(saved)}, config {tuple(model)})"
                  for name, saved, model in info.get("mismatched_keys", ())]
    problems = []
    if missing:
        problems.append(f"{len(missing)} tensor(s) missing from the weights: {_listed(missing)}")
    if unexpected:
        problems.append(f"{len(unexpected)} unexpected tensor(s) in the weights that the "
                        f"config does not use: {_listed(unexpected)}")
    if mismatched:
        problems.append(f"{len(mismatched)} tensor(s) of another shape: {_listed(mismatched)}")
    if problems:
        raise ModelLoadError(
            f"model directory {path!r}: its config.json does not match its weights; "
            + "; ".join(problems) + ". Training it would start from random tensors: fix "
            "config.json (num_hidden_layers, hidden_size, intermediate_size, vocab_size, "
            "...) or point at the directory the weights were saved with")

_DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16,
           "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16}


def resolve_device(spec: str, ctx_device: str | None, local_rank: int = 0) -> torch.device:
    """The model's device: config wins unless "auto"; then the context's, then CUDA if any."""
    if spec not in ("auto", "", None):
        if spec == "cuda":
            return torch.device("cuda", local_rank)
        return torch.device(spec)
    if ctx_device:
        return torch.device(ctx_device)
    return torch.device("cuda", local_rank) if torch.cuda.is_available() else torch.device("cpu")


def native_bf16() -> bool:
    """bf16 computes natively here: a CUDA device with bf16, or (no CUDA) a CPU with
    AVX-512 BF16 or AMX. An AVX2-only CPU emulates bf16: the real model's update ran
    ~21x slower there, and 1.8x faster than fp32 on an AMX one (docs/benchmarks.md)."""
    if torch.cuda.is_available():
        return torch.cuda.is_bf16_supported()
    probes = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    return any(getattr(torch.cpu, probe, lambda: False)() for probe in probes)


def resolve_dtype(name: str) -> torch.dtype:
    """`model.dtype` -> a torch dtype; "auto": bf16 where it is native, else fp32."""
    if name == "auto":
        return torch.bfloat16 if native_bf16() else torch.float32
    try:
        return _DTYPES[name]
    except KeyError:
        raise ValueError(f"unknown model dtype {name!r}; use one of "
                         f"{sorted(_DTYPES) + ['auto']}") from None


TOKEN_ID_KEYS = ("pad_token_id", "eos_token_id", "bos_token_id")


def token_ids_from_tokenizer(config, tokenizer) -> None:
    """Give `config` the tokenizer's pad/eos/bos ids wherever the tokenizer has one.
    The tokenizer is the authority: the rollout assembler ends a response at its eos,
    while vLLM also stops at the config's (and LlamaConfig's defaults, bos=1 eos=2, are
    not None, so copying only over None left the char tokenizer's <bos>=2 as eos)."""
    for key in TOKEN_ID_KEYS:
        value = getattr(tokenizer, key, None)
        if value is not None:
            setattr(config, key, value)


def _hf_config(model_cfg: ModelConfig, tokenizer, path: str | None, **overrides):
    from transformers import AutoConfig
    if path is not None:
        from hybridflow.core.loading import library_read
        folder = require_local_dir(path, "model")
        with library_read(os.path.join(folder, "config.json"), "model config",
                          "a Hugging Face model directory holds a JSON config.json"):
            config = AutoConfig.from_pretrained(folder)
    else:
        values = dict(model_cfg.hf_config)
        model_type = values.pop("model_type", "llama")
        values.setdefault("vocab_size", len(tokenizer))
        config = AutoConfig.for_model(model_type, **values)
    token_ids_from_tokenizer(config, tokenizer)
    for key, value in overrides.items():
        setattr(config, key, value)
    return config


@contextmanager
def no_loading_bars():
    """transformers' `Loading weights` / `Loading checkpoint shards` progress bars off
    while a model loads: every rank of every role draws one, which Ray prints through
    its log prefixes on every run (and a local run over the step's own progress)."""
    from transformers.utils import logging as hf_logging
    was_on = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_on:
            hf_logging.enable_progress_bar()


def _build(auto_cls, model_cfg: ModelConfig, tokenizer, device, seed: int,
           path: str | None = None, may_miss: tuple[str, ...] = (),
           may_leave: tuple[str, ...] = (), tp_mesh=None, **overrides):
    path = model_cfg.path if path is None else path
    config = _hf_config(model_cfg, tokenizer, path, **overrides)
    dtype = resolve_dtype(model_cfg.dtype)
    files = _shard_files(path) if tp_mesh is not None else None
    with no_loading_bars():
        if files is not None:  # each rank reads only its shards (parallel/shard_build.py)
            model = _build_shards(auto_cls, config, dtype, device, seed, path, tp_mesh,
                                  files, may_miss, may_leave)
        else:
            model = _build_whole(auto_cls, config, dtype, seed, path, may_miss, may_leave)
    if model_cfg.gradient_checkpointing:
        model.gradient_checkpointing_enable()
    if model_cfg.use_remove_padding:  # packed forwards: attention per sequence
        from hybridflow.workers.varlen_attention import use_varlen_attention
        use_varlen_attention(model)
    model = model.to(device)
    if tp_mesh is not None and files is None:  # a seeded config or a .bin: whole, then shard
        from hybridflow.workers.parallel.parallelize import apply_parallelism
        apply_parallelism(model, tp_mesh)  # tp here; the trainer's backend wraps dp
    return model


def _shard_files(path: str | None) -> dict[str, str] | None:
    """The safetensors files a tensor-parallel rank reads its shards from, or None: a
    model from a config (seeded, built whole), or a directory without safetensors."""
    if path is None:
        return None
    from hybridflow.core.loading import library_read
    from hybridflow.workers.parallel.shard_build import safetensors_files
    with library_read(path, "model directory", "its weight index is damaged: save the "
                      "model again"):
        return safetensors_files(require_local_dir(path, "model"))


def _build_shards(auto_cls, config, dtype, device, seed: int, path: str, tp_mesh, files,
                  may_miss: tuple[str, ...], may_leave: tuple[str, ...]):
    from hybridflow.core.loading import library_read
    from hybridflow.workers.parallel.shard_build import empty_shards, init_missing, read_shards
    model = empty_shards(auto_cls, config, dtype, torch.device(device), tp_mesh)
    with library_read(path, "model directory", "its weight files are damaged or not the "
                      "model's: save the model again"):
        info = read_shards(model, files)
    check_loading_info(path, info, may_miss, may_leave)
    init_missing(model, seed)
    return model


def _build_whole(auto_cls, config, dtype, seed: int, path: str | None,
                 may_miss: tuple[str, ...], may_leave: tuple[str, ...]):
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)  # heads missing from a checkpoint init the same everywhere
        if path is not None:
            from hybridflow.core.loading import library_read
            with library_read(path, "model directory", "its weight files are damaged or "
                              "not the model's: save the model again"):
                model, info = auto_cls.from_pretrained(path, config=config, dtype=dtype,
                                                       output_loading_info=True,
                                                       ignore_mismatched_sizes=True)
            check_loading_info(path, info, may_miss, may_leave)
            return model
        return auto_cls.from_config(config).to(dtype)


def build_causal_lm(model_cfg: ModelConfig, tokenizer, device, seed: int = 0,
                    path: str | None = None, tp_mesh=None):
    """A causal LM (policy or reference) on `device` in the configured dtype; with
    `tp_mesh` (`role_tp_mesh`) this rank's tensor-parallel shard of it."""
    from transformers import AutoModelForCausalLM
    return _build(AutoModelForCausalLM, model_cfg, tokenizer, device, seed, path,
                  tp_mesh=tp_mesh)


def build_value_model(model_cfg: ModelConfig, tokenizer, device, seed: int = 0,
                      path: str | None = None, tp_mesh=None):
    """The critic: the causal-LM backbone with a token-level Linear(hidden, 1) head.
    From a causal-LM checkpoint the head is new and lm_head unused: expected (only
    those), so transformers' load report is silenced here."""
    from transformers import AutoModelForTokenClassification
    from transformers.utils import logging as hf_logging
    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        return _build(AutoModelForTokenClassification, model_cfg, tokenizer, device, seed,
                      path, may_miss=("score.",), may_leave=("lm_head.",), num_labels=1,
                      classifier_dropout=0.0, tp_mesh=tp_mesh)
    finally:
        hf_logging.set_verbosity(level)


def build_reward_model(model_cfg: ModelConfig, tokenizer, device, path: str, seed: int = 0):
    """A reward model: sequence classification with one label, read at the last token.
    Its head must come from the directory: an untrained head scores at random."""
    from transformers import AutoModelForSequenceClassification
    return _build(AutoModelForSequenceClassification, model_cfg, tokenizer, device, seed,
                  path, num_labels=1)


def role_tp_mesh(ctx):
    """The "tp" dimension of a tensor-parallel role's device mesh (what its models are
    built sharded over), or None at tp=1. Collective: every rank of the pool calls it."""
    if getattr(ctx, "tp", 1) <= 1:
        return None
    return ctx.device_mesh()["tp"]


def model_bytes(module: torch.nn.Module) -> int:
    """Bytes of the parameters and buffers this process holds (shared storage once)."""
    seen, total = set(), 0
    for t in list(module.parameters()) + list(module.buffers()):
        local = local_shard(t)
        key = (local.untyped_storage().data_ptr(), local.dtype)
        if key in seen:
            continue
        seen.add(key)
        total += local.numel() * local.element_size()
    return total
