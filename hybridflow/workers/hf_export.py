"""Writing a Hugging Face model directory without holding the whole model: tensors
arrive one bucket at a time (gathered from a live module, read from a sharded DCP
checkpoint, or from an old single `model.safetensors`) and are written in safetensors
shards of at most `max_shard_bytes`, Hugging Face's layout:

    model.safetensors                       when everything fits one shard
    model-00001-of-00003.safetensors ...    past the limit, with
    model.safetensors.index.json            {"metadata": {"total_size"}, "weight_map"}

The peak is one shard being filled (plus the bucket being read). A tensor tied to
another is written once: `lm_head.weight` is left out when the config ties the word
embeddings (`from_pretrained` ties it back). Stateless.
"""
from __future__ import annotations

import json
import os
from typing import Iterable, Iterator

import torch

__all__ = ["MAX_SHARD_BYTES", "INDEX_FILE", "write_hf_shards", "dcp_tensors",
           "safetensors_tensors", "write_module", "write_checkpoint_weights"]

MAX_SHARD_BYTES = 5 * 10**9  # Hugging Face's default max_shard_size ("5GB")
INDEX_FILE = "model.safetensors.index.json"
_WEIGHTS_FILE = "model.safetensors"
_TIED_HEAD = "lm_head.weight"


def _shard_name(k: int, n: int) -> str:
    return f"model-{k:05d}-of-{n:05d}.safetensors"


def write_hf_shards(tensors: Iterable[tuple[str, torch.Tensor]], out: str,
                    max_shard_bytes: int = MAX_SHARD_BYTES, tied: bool = False) -> list[str]:
    """Write `tensors` into `out` as one file or as shards with their index; returns
    the weight files written. `tied`: the config ties the word embeddings."""
    from safetensors.torch import save_file
    if max_shard_bytes < 1:
        raise ValueError(f"max shard size must be positive, got {max_shard_bytes} bytes")
    os.makedirs(out, exist_ok=True)
    parts, shard, size, total, names = [], {}, 0, 0, {}

    def flush(tensors: dict):
        part = os.path.join(out, f".part-{len(parts):05d}.safetensors")
        save_file(tensors, part, metadata={"format": "pt"})
        parts.append(part)

    for name, tensor in tensors:
        if tied and name == _TIED_HEAD:
            continue
        nbytes = tensor.numel() * tensor.element_size()
        if shard and size + nbytes > max_shard_bytes:
            flush(shard)
            shard, size = {}, 0
        shard[name] = tensor.detach().cpu().contiguous()
        names[name] = len(parts)
        size, total = size + nbytes, total + nbytes
    if shard or not parts:
        flush(shard)
    shard = {}
    if len(parts) == 1:
        os.replace(parts[0], os.path.join(out, _WEIGHTS_FILE))
        return [_WEIGHTS_FILE]
    files = [_shard_name(k + 1, len(parts)) for k in range(len(parts))]
    for part, file in zip(parts, files):
        os.replace(part, os.path.join(out, file))
    with open(os.path.join(out, INDEX_FILE), "w") as fh:
        json.dump({"metadata": {"total_size": total},
                   "weight_map": {n: files[k] for n, k in names.items()}}, fh, indent=1)
    return files


def dcp_tensors(dcp_dir: str, bucket_bytes: int, prefix: str = "model."
                ) -> Iterator[tuple[str, torch.Tensor]]:
    """The tensors saved under `prefix` in a DCP checkpoint, read bucket by bucket in
    one process (DCP assembles each from every rank's chunks), under plain names; read
    through `safe_dcp`, so nothing in the checkpoint is unpickled unsafely."""
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata
    from hybridflow.workers.parallel.gather import plain_weight_name
    from hybridflow.workers.parallel.safe_dcp import load_dcp, read_metadata
    meta = read_metadata(os.path.join(dcp_dir, ".metadata")).state_dict_metadata
    wanted = [(k, v) for k, v in meta.items()
              if k.startswith(prefix) and isinstance(v, TensorStorageMetadata)]
    bucket, size = {}, 0
    for key, info in wanted + [(None, None)]:
        nbytes = 0 if key is None else info.size.numel() * \
            torch.empty((), dtype=info.properties.dtype).element_size()
        if bucket and (key is None or size + nbytes > bucket_bytes):
            load_dcp(bucket, dcp_dir, no_dist=True)
            for k, tensor in bucket.items():
                name = plain_weight_name(k[len(prefix):])
                if name is not None:
                    yield name, tensor
            bucket, size = {}, 0
        if key is not None:
            bucket[key] = torch.empty(tuple(info.size), dtype=info.properties.dtype)
            size += nbytes


def safetensors_tensors(path: str) -> Iterator[tuple[str, torch.Tensor]]:
    """The tensors of one safetensors file, one at a time."""
    from safetensors import safe_open
    with safe_open(path, framework="pt") as fh:
        for name in fh.keys():
            yield name, fh.get_tensor(name)


def _tied(config) -> bool:
    return bool(getattr(config, "tie_word_embeddings", False))


def write_module(module: torch.nn.Module, out: str, rank: int, bucket_bytes: int,
                 max_shard_bytes: int = MAX_SHARD_BYTES, config=None) -> None:
    """A live (possibly sharded) module to `out`, gathered bucket by bucket. Every rank
    calls it (collective when sharded); rank 0 writes the weights and the config."""
    from hybridflow.workers.parallel.gather import gathered_buckets, weight_plan
    buckets = gathered_buckets(module, weight_plan(module, bucket_bytes), keep=rank == 0,
                               device="cpu")
    if rank != 0:
        for _ in buckets:  # the gather is collective: feed rank 0's
            pass
        return
    config = config if config is not None else getattr(module, "config", None)
    write_hf_shards((item for bucket in buckets for item in bucket), out, max_shard_bytes,
                    tied=_tied(config))
    if config is not None and hasattr(config, "save_pretrained"):
        config.save_pretrained(out)


def write_checkpoint_weights(role_dir: str, out: str, bucket_bytes: int,
                             max_shard_bytes: int = MAX_SHARD_BYTES) -> list[str]:
    """The weights of a role's checkpoint (sharded DCP, or an old `model.safetensors`)
    rewritten into `out` as Hugging Face shards; the config beside them decides ties."""
    from hybridflow.workers.parallel.sharded_checkpoint import DCP_DIR, is_sharded_checkpoint
    config = {}
    config_path = os.path.join(role_dir, "config.json")
    if os.path.isfile(config_path):
        from hybridflow.core.loading import read_json
        config = read_json(config_path, "checkpoint model config", dict)
    tied = bool(config.get("tie_word_embeddings", False))
    if is_sharded_checkpoint(role_dir):
        source = dcp_tensors(os.path.join(role_dir, DCP_DIR), bucket_bytes)
    else:
        path = os.path.join(role_dir, _WEIGHTS_FILE)
        if not os.path.isfile(path):
            raise FileNotFoundError(f"checkpoint role directory {role_dir!r} has neither "
                                    f"{DCP_DIR}/ nor {_WEIGHTS_FILE}: nothing to export")
        source = safetensors_tensors(path)
    return write_hf_shards(source, out, max_shard_bytes, tied=tied)
