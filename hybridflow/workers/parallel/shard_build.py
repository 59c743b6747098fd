"""Building a tensor-parallel model from a checkpoint one shard at a time: no rank ever
holds a whole copy of the model (issue 30).

`empty_shards` makes the model on the meta device (shapes, no storage), shards it there
by the tensor-parallel plan (`parallelize.apply_parallelism`: meta DTensors) and
gives each rank storage for its own shards only (`to_empty`); `read_shards` fills them
from the directory's safetensors files one tensor at a time, each rank reading only its
rows or columns of each tensor (`safe_open(...).get_slice`; a tied weight is one
parameter, read once); `init_missing` initialises what the files do not hold as
`from_pretrained` does: every loaded tensor is marked `_is_hf_initialized`, then
`initialize_weights()` under the build seed sets the rest, a head new to the checkpoint
(a critic's value head) and the non-persistent buffers (the rotary `inv_freq`, which
`to_empty` leaves as garbage). A rank's high-water mark while building is its shards
plus one slice in flight (the slice's copy and its mapped file pages). FSDP2 over "dp"
is applied afterwards by the backend, to the materialised tp shard. Checkpoint names
must be the model's own (or differ by the base model's prefix): transformers' key
renaming for legacy checkpoints is not applied, and a name that does not match is
reported as missing / unexpected by `models.check_loading_info`.

A model built from a config (seeded random init: tests and the toy task) is not built
here: its values are the seeded stream of a whole-model construction (nn.Linear's own
init while constructing, then transformers' `_init_weights`), which a per-shard build
cannot replay, so that path builds the whole model and shards it after
(`models.py`). So does a directory without safetensors (a `pytorch_model.bin` is one
pickled whole model).

State: none; functions over the model they are given.
"""
from __future__ import annotations

import json
import os
from contextlib import contextmanager

import torch

from hybridflow.core.dtensor import local_shard

__all__ = ["empty_shards", "read_shards", "init_missing", "safetensors_files", "local_slices"]

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"


def safetensors_files(folder: str) -> dict[str, str] | None:
    """Checkpoint tensor name -> the safetensors file holding it, from the index of a
    sharded checkpoint or the one `model.safetensors`; None when the folder has neither."""
    index = os.path.join(folder, INDEX_FILE)
    if os.path.isfile(index):
        with open(index) as fh:
            weight_map = json.load(fh).get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise ValueError(f"{index}: no 'weight_map' of tensor names to files; save the "
                             "model again (save_pretrained) or remove the index")
        return {name: os.path.join(folder, file) for name, file in weight_map.items()}
    single = os.path.join(folder, SINGLE_FILE)
    if not os.path.isfile(single):
        return None
    from safetensors import safe_open
    with safe_open(single, framework="pt") as handle:
        return {name: single for name in handle.keys()}


def local_slices(tensor: torch.Tensor) -> tuple[slice, ...]:
    """The index of this rank's part of `tensor`'s global value: a DTensor's local
    shard (any placements, uneven sizes as DTensor splits them), all of a plain tensor."""
    if not hasattr(tensor, "device_mesh"):
        return tuple(slice(0, n) for n in tensor.shape)
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset
    shape, offset = compute_local_shape_and_global_offset(tensor.shape, tensor.device_mesh,
                                                          tensor.placements)
    return tuple(slice(o, o + n) for o, n in zip(offset, shape))


def _local(tensor: torch.Tensor) -> torch.Tensor:
    return local_shard(tensor)


def _unique_tensors(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter and persistent buffer once, by its first name (a tied weight is
    found under the name of its first module, e.g. the input embedding)."""
    seen, out = set(), {}
    for name, tensor in model.state_dict(keep_vars=True).items():
        if id(tensor) not in seen:
            seen.add(id(tensor))
            out[name] = tensor
    return out


def _checkpoint_name(name: str, names: dict, prefix: str) -> str | None:
    """The checkpoint's name of the model's tensor `name`: the same, or with the base
    model's prefix added or dropped (a checkpoint of the bare base model)."""
    candidates = [name]
    if prefix and name.startswith(prefix + "."):
        candidates.append(name[len(prefix) + 1:])
    elif prefix:
        candidates.append(f"{prefix}.{name}")
    return next((c for c in candidates if c in names), None)


@contextmanager
def _tensor_slice(file: str, name: str):
    """One tensor of a safetensors file, to slice. The file is memory-mapped: opened for
    this one tensor, so the pages a column slice touches (every row of the tensor) are
    unmapped before the next tensor, not held until the whole model is read."""
    from safetensors import safe_open
    with safe_open(file, framework="pt") as handle:
        yield handle.get_slice(name)


@torch.no_grad()
def read_shards(model: torch.nn.Module, files: dict[str, str]) -> dict:
    """Copy each parameter's and persistent buffer's local part from `files` (name ->
    safetensors file) into `model` (materialised, possibly sharded); mark what was read
    `_is_hf_initialized`. Returns `from_pretrained`'s loading info: missing, unexpected
    and mismatched (name, checkpoint shape, model shape) tensors."""
    prefix = getattr(model, "base_model_prefix", "") or ""
    aliases = {name for name in model.state_dict(keep_vars=True)}
    used, missing, mismatched = set(), [], []
    for name, tensor in _unique_tensors(model).items():
        saved = _checkpoint_name(name, files, prefix)
        if saved is None:
            missing.append(name)
            continue
        used.add(saved)
        with _tensor_slice(files[saved], saved) as part:
            if tuple(part.get_shape()) != tuple(tensor.shape):
                mismatched.append((name, tuple(part.get_shape()), tuple(tensor.shape)))
                continue
            _local(tensor).copy_(part[local_slices(tensor)])
        tensor._is_hf_initialized = True
    # a tied weight saved under both names (or a buffer some versions saved) is no problem
    tied = {_checkpoint_name(a, files, prefix) for a in aliases}
    unexpected = [n for n in files if n not in used and n not in tied]
    return {"missing_keys": missing, "unexpected_keys": unexpected,
            "mismatched_keys": mismatched}


@contextmanager
def _seeded(seed: int):
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield


def _meta_model(auto_cls, config, dtype: torch.dtype) -> torch.nn.Module:
    from transformers import initialization
    with torch.device("meta"), initialization.no_init_weights():
        model = auto_cls.from_config(config, dtype=dtype)
    model.tie_weights()  # no_init_weights skips the tying too (tie_word_embeddings)
    return model


def _retie(model: torch.nn.Module, tied: bool) -> None:
    """`to_empty` gives every module its own new tensor; a tied head shares the
    embedding's parameter again (as `parallelize` left it)."""
    if tied:
        model.get_output_embeddings().weight = model.get_input_embeddings().weight


def _is_tied(model: torch.nn.Module) -> bool:
    embed = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    return head is not None and embed is not None and head.weight is embed.weight


def empty_shards(auto_cls, config, dtype: torch.dtype, device: torch.device, tp_mesh):
    """This rank's shards of `auto_cls(config)` over the 1-D mesh `tp_mesh`, in `dtype`
    on `device`, with storage but no values yet (`read_shards`, then `init_missing`)."""
    from hybridflow.workers.parallel.parallelize import apply_parallelism
    model = _meta_model(auto_cls, config, dtype)
    tied = _is_tied(model)
    apply_parallelism(model, tp_mesh)  # on the meta device: meta DTensors
    model.to_empty(device=device)
    _retie(model, tied)
    return model


def init_missing(model: torch.nn.Module, seed: int) -> None:
    """Initialise what `read_shards` did not fill, as `from_pretrained` does: a head
    new to the checkpoint, and the non-persistent buffers (rotary `inv_freq`)."""
    with _seeded(seed):
        model.initialize_weights()
    for tensor in model.state_dict(keep_vars=True).values():
        tensor.__dict__.pop("_is_hf_initialized", None)
    model.eval()  # from_pretrained's mode; the trainer switches to train()
