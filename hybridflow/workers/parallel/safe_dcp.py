"""The one door through which a `torch.distributed.checkpoint` (DCP) directory is read:
nothing in it can run code, and whatever is wrong with it is one line naming the file.

DCP itself unpickles twice: `FileSystemReader.read_metadata` runs `pickle.load` on
`dcp/.metadata`, and `DefaultLoadPlanner.load_bytes` runs `torch.load(weights_only=False)`
on every non-tensor entry of the saved state (the optimizer's `lr`, `betas`, ...). A
crafted checkpoint runs its code in either. Here:

- `SafeReader.read_metadata` unpickles `.metadata` with `MetadataUnpickler`, which admits
  only DCP's own metadata classes and the few torch and standard globals their pickles
  name (`METADATA_GLOBALS`, read off the opcodes of the metadata torch 2.13 writes); any
  other global is refused before it is looked up. The result is then checked for shape:
  a `Metadata` whose entries are DCP's types and whose shards are plain file names in
  the checkpoint directory.
- `SafeReader.prepare_local_plan` checks, before anything is read, that every shard
  file this rank reads exists and is long enough for what the index says it holds.
- `SafeLoadPlanner.load_bytes` reads a non-tensor entry with `read_torch`
  (`weights_only=True`); tensor entries DCP already reads with `weights_only=True`.
- `load_dcp` runs `dcp.load` through both and turns what DCP wraps in a
  `CheckpointException` back into the one-line error that caused it.

Audit of every reader of run-directory data (issue 36), and what each goes through:

    dcp/.metadata, dcp/__<r>_0.distcp  this module (load_trainer, hf_export.dcp_tensors)
    <role>/scheduler.pt, optim_rank*.pt  core.loading.read_torch (weights_only=True)
    batch dumps (run/batch_dump.py)     core.loading.read_torch
    model.safetensors, adapter, RNG     safetensors (no code), core.loading
    manifest, trainer_state, records    JSON / YAML (safe_load) via core.loading
    LoRA merge at export                peft `PeftModel.from_pretrained` on the adapter
                                        directory: only after its safetensors file is
                                        checked, so peft never falls back to a `.bin`
    config.json, tokenizer files        transformers, trust_remote_code never set
    np.load / pickle.load               not used on run-directory data anywhere
"""
from __future__ import annotations

import io
import os
import pickle
import warnings
from typing import Any

import torch
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.planner import LoadPlan, ReadItem

from hybridflow.core.loading import (UserFileError, check_file, read_torch, refused,
                                     torch_refusal)

__all__ = ["METADATA_GLOBALS", "CheckpointFileError", "MetadataUnpickler", "SafeReader",
           "SafeLoadPlanner", "read_metadata", "load_dcp"]

FIX = ("the checkpoint is damaged or was tampered with: resume from the checkpoint "
       "before it, or save it again")
_META = "torch.distributed.checkpoint.metadata"
METADATA_GLOBALS = frozenset(
    {(_META, name) for name in ("Metadata", "MetadataIndex", "StorageMeta",
                                "TensorProperties", "TensorStorageMetadata",
                                "BytesStorageMetadata", "ChunkStorageMetadata",
                                "_MEM_FORMAT_ENCODING")}
    | {("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
       ("torch", "Size"), ("torch.serialization", "_get_layout"),
       ("collections", "OrderedDict"),
       ("pathlib", "PosixPath"), ("pathlib", "PurePosixPath"),  # the saved checkpoint_id
       ("pathlib._local", "PosixPath"), ("pathlib._local", "PurePosixPath")}  # Python 3.13
    | {("torch", name) for name, value in vars(torch).items() if isinstance(value, torch.dtype)})


class CheckpointFileError(UserFileError):
    """A DCP file that is missing, short, or not what DCP wrote; one line naming it."""


class MetadataUnpickler(pickle.Unpickler):
    """Unpickles DCP's index and nothing else: a global outside `METADATA_GLOBALS` is
    refused before it is imported, so no other callable can be reached."""

    def __init__(self, stream, path: str):
        super().__init__(stream)
        self.path = path

    def find_class(self, module: str, name: str):
        if (module, name) not in METADATA_GLOBALS:
            raise refused("checkpoint file", self.path, "checkpoint metadata",
                          f"{module}.{name}", FIX)
        return super().find_class(module, name)


def read_metadata(path: str):
    """DCP's `Metadata` from `path` (a `.metadata` file), through `MetadataUnpickler`."""
    from torch.distributed.checkpoint.metadata import Metadata
    check_file(path, "checkpoint file", FIX)
    with open(path, "rb") as handle:
        try:
            metadata = MetadataUnpickler(handle, path).load()
        except UserFileError:
            raise
        except Exception as err:  # noqa: BLE001 - a cut or garbled pickle raises anything
            raise CheckpointFileError(f"checkpoint file {path!r} is not DCP metadata "
                                      f"({type(err).__name__}: {str(err)[:120]}); {FIX}",
                                      path) from None
    if not isinstance(metadata, Metadata):
        raise CheckpointFileError(f"checkpoint file {path!r} holds a "
                                  f"{type(metadata).__name__}, not DCP metadata; {FIX}", path)
    _check_shape(metadata, path)
    return metadata


def _check_shape(metadata, path: str) -> None:
    """Admitted classes can still be filled with anything: every entry must be of DCP's
    types, and every shard a plain file name in this directory (never a path out)."""
    from torch.distributed.checkpoint.filesystem import _StorageInfo
    from torch.distributed.checkpoint.metadata import (BytesStorageMetadata, MetadataIndex,
                                                       TensorStorageMetadata)

    def bad(what: str):
        return CheckpointFileError(f"checkpoint file {path!r} is not DCP metadata: {what}; "
                                   f"{FIX}", path)

    entries = metadata.state_dict_metadata
    if not isinstance(entries, dict) or not all(
            isinstance(k, str) and isinstance(v, (TensorStorageMetadata, BytesStorageMetadata))
            for k, v in entries.items()):
        raise bad("its entries are not DCP's tensor and bytes records")
    storage = metadata.storage_data
    if not isinstance(storage, dict):
        raise bad("it has no table of shard files")
    for index, info in storage.items():
        if not isinstance(index, MetadataIndex) or not isinstance(info, _StorageInfo):
            raise bad("its shard table holds other objects")
        name = info.relative_path
        if not isinstance(name, str) or os.path.basename(name) != name or name in ("", ".", ".."):
            raise bad(f"shard {name!r} is not a file name in the checkpoint directory")
        if not all(isinstance(n, int) and n >= 0 for n in (info.offset, info.length)):
            raise bad(f"entry {index.fqn!r} has no valid offset and length")
        if info.transform_descriptors:  # this project saves none (no compression)
            raise bad(f"entry {index.fqn!r} names stream transforms "
                      f"{list(info.transform_descriptors)[:3]}")


class SafeReader(FileSystemReader):
    """DCP's file reader, with the metadata unpickled safely and every shard checked
    before it is read; remembers the entry being read, to name its file on a failure."""

    def __init__(self, path: str):
        super().__init__(path)
        self.reading: str | None = None  # the shard file being read, to name it
        self.metadata = None

    def shard_path(self, relative: str) -> str:
        return os.path.join(str(self.path), relative)

    def read_metadata(self, *args: Any):
        """The global `.metadata` only: without `**kwargs` DCP does not fall back to
        per-rank metadata files (this project writes none), nor log tracebacks."""
        from torch.distributed.checkpoint.metadata import StorageMeta
        if self.metadata is None:  # load_dcp reads it first; DCP asks again
            self.metadata = read_metadata(str(self._get_metadata_path()))
        metadata = self.metadata
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        need: dict[str, int] = {}
        for item in plan.items:
            info = self.storage_data[item.storage_index]
            need[info.relative_path] = max(need.get(info.relative_path, 0),
                                           info.offset + info.length)
        for relative, end in sorted(need.items()):
            _check_shard(self.shard_path(relative), end)
        return plan

    def _slice_file(self, file, sinfo):
        self.reading = self.shard_path(sinfo.relative_path)
        return super()._slice_file(file, sinfo)


def _check_shard(path: str, end: int) -> None:
    fix = ("resume from the checkpoint before it, or save this one again (a shard is "
           "lost when a save or a copy was cut short)")
    if not os.path.isfile(path):
        raise CheckpointFileError(f"checkpoint shard {path!r} is missing: the checkpoint's "
                                  f"index (.metadata) lists it; {fix}", path)
    size = os.path.getsize(path)
    if size < end:
        raise CheckpointFileError(f"checkpoint shard {path!r} is truncated: {size} bytes, "
                                  f"and the index (.metadata) places data up to byte {end}; "
                                  f"{fix}", path)


class SafeLoadPlanner(DefaultLoadPlanner):
    """DCP's load planner, but a non-tensor entry is read with `weights_only=True`."""

    def __init__(self, reader: SafeReader):
        super().__init__()
        self.reader = reader

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        from torch.distributed.checkpoint._nested_dict import set_element
        info = self.reader.storage_data[read_item.storage_index]
        fqn = read_item.dest_index.fqn
        loaded = read_torch(value, f"checkpoint entry {fqn!r} in",
                            self.reader.shard_path(info.relative_path), FIX)
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[fqn], loaded)
        else:
            self.state_dict[fqn] = loaded


def load_dcp(state: dict, dcp_dir: str, no_dist: bool) -> None:
    """`dcp.load(state)` from `dcp_dir` through `SafeReader` and `SafeLoadPlanner`.
    A file problem is raised as the one-line error that caused it (DCP wraps every
    rank's failure in a `CheckpointException`, a BaseException with tracebacks);
    anything else (keys that do not match) is re-raised as DCP raised it."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException
    reader = SafeReader(dcp_dir)
    reader.read_metadata()  # first, outside DCP: a refusal is raised as it is, not logged
    try:
        with warnings.catch_warnings():  # one rank without a process group: it is meant
            warnings.filterwarnings("ignore", message=".*assuming the intent is to",
                                    category=UserWarning)
            dcp.load(state, storage_reader=reader, planner=SafeLoadPlanner(reader),
                     no_dist=no_dist)
    except CheckpointException as err:
        cause = _file_cause(err, reader)
        if cause is not None:
            raise cause from None
        raise
    except UserFileError:
        raise
    except Exception as err:
        cause = _file_cause(err, reader)
        if cause is not None:
            raise cause from None
        raise


def _file_cause(err: BaseException, reader: SafeReader) -> UserFileError | None:
    """The file error behind a DCP failure, as one line; None when it is not one."""
    from torch.distributed.checkpoint.api import CheckpointException
    causes = [exc for exc, _ in err.failures.values()] \
        if isinstance(err, CheckpointException) else [err]
    for exc in causes:
        if isinstance(exc, UserFileError):
            return exc
    for exc in causes:
        if isinstance(exc, OSError) and getattr(exc, "filename", None):
            return CheckpointFileError(f"checkpoint file {exc.filename!r} cannot be read "
                                       f"({exc.strerror or exc}); {FIX}", exc.filename)
        if reader.reading is None or isinstance(exc, AssertionError):
            continue  # not in a shard's read (keys, shapes): the caller's to explain
        name = torch_refusal(exc)
        if name is not None:
            return refused("checkpoint shard", reader.reading, "a tensor", name, FIX)
        detail = (str(exc).strip().splitlines() or [""])[0][:160]
        return CheckpointFileError(f"checkpoint shard {reader.reading!r} cannot be read "
                                   f"({type(exc).__name__}: {detail}); {FIX}", reader.reading)
    return None
