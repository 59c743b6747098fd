"""`hybridflow export RUN_DIR OUT [--role actor] [--max-shard-size 5GB]`: a role's
weights from the run's last checkpoint as a Hugging Face model directory (loadable
with `from_pretrained`, and as `model.path` of another run): the weights, the model's
config and the tokenizer files; optimizer state and RNG state stay behind. The
checkpoint's files are verified against its manifest (sha256) first.
A sharded checkpoint (DCP, one file per training rank) is read bucket by bucket and
written as safetensors shards of at most --max-shard-size with their index
(`model-00001-of-0000N.safetensors`, `model.safetensors.index.json`), never holding
the whole model (`hybridflow/workers/hf_export.py`); an old checkpoint's single
`model.safetensors` is copied, or resharded the same way when it is past the limit.
A LoRA checkpoint (adapters only) is merged into the run's base model, unless
`--adapter-only` copies peft's adapter files as they are.

Nothing half-written: the export is made in a hidden sibling folder of OUT and
renamed to OUT once complete; an export that fails, or that finds no weights to
write (a damaged checkpoint), removes it and exits 1. OUT must not exist, or be an
empty directory. Writing into a non-empty OUT is deprecated (a warning; refused from
the next release): the finished files are moved in over what is there."""
from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import sys
import tempfile
import warnings

from hybridflow.core.printable import echo
from hybridflow.run.checkpoint import CheckpointError, latest_checkpoint, verify_checkpoint

__all__ = ["add_parser", "run", "export_role", "is_model_file", "parse_size",
           "ExportIntoExistingWarning"]

_TRAINING_STATE = ("optim_", "rng_", "scheduler_", "scheduler.")  # a run's, not the model's
_READ_BUCKET_BYTES = 256 * 2**20  # a sharded checkpoint is read this much at a time
_UNITS = {"KB": 10**3, "MB": 10**6, "GB": 10**9, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30,
          "B": 1}


def add_parser(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser("export", help="export a role's weights from a run")
    parser.add_argument("run_dir")
    parser.add_argument("out")
    parser.add_argument("--role", default="actor")
    parser.add_argument("--adapter-only", action="store_true",
                        help="LoRA runs: export the adapter files, not the merged model")
    parser.add_argument("--max-shard-size", default="5GB",
                        help="largest safetensors file (e.g. 5GB, 500MB, 2GiB); past it "
                             "the weights are sharded with model.safetensors.index.json")
    return parser


def parse_size(text: str) -> int:
    """'5GB' -> 5e9 bytes (also MB, KB, GiB, MiB, KiB, B, or a plain byte count)."""
    spec = str(text).strip().upper().replace(" ", "")
    for unit in sorted(_UNITS, key=len, reverse=True):
        if spec.endswith(unit):
            spec, scale = spec[:-len(unit)], _UNITS[unit]
            break
    else:
        scale = 1
    try:
        size = int(float(spec) * scale)
    except ValueError:
        size = 0
    if size < 1:
        raise CheckpointError(f"--max-shard-size {text!r} is not a size: give e.g. 5GB, "
                              f"500MB or 2GiB")
    return size


def _check_role_name(role: str) -> None:
    """A role is one plain name: '../..' or 'a/b' would read outside the checkpoint."""
    if not role or role in (".", "..") or os.sep in role or "/" in role or "\0" in role \
            or (os.altsep and os.altsep in role):
        raise CheckpointError(f"--role {role!r} is not a role name: give one plain name "
                              f"like actor or critic (a path would read outside the "
                              f"checkpoint)")


def _inside(root: str, path: str) -> bool:
    root = os.path.realpath(root)
    return os.path.commonpath([root, os.path.realpath(path)]) == root


def _incomplete(root: str) -> str:
    """' (step_000003 lacks manifest.json)' for checkpoint folders without a manifest."""
    names = sorted(n for n in os.listdir(root) if n.startswith("step_")) \
        if os.path.isdir(root) else []
    return f" ({', '.join(names)} lack manifest.json: damaged)" if names else ""


def export_role(run_dir: str, out: str, role: str = "actor", merge: bool = True,
                max_shard_bytes: int = 5 * 10**9) -> str:
    from hybridflow.core.loading import check_dir
    _check_role_name(role)
    check_dir(run_dir, "run directory", "give a directory made by `hybridflow run`")
    ckpt = latest_checkpoint(os.path.join(run_dir, "checkpoints"))
    if ckpt is None:
        raise FileNotFoundError(f"{run_dir} has no complete checkpoint"
                                f"{_incomplete(os.path.join(run_dir, 'checkpoints'))}")
    source = os.path.join(ckpt, role)
    if not _inside(ckpt, source):  # a role directory linked to elsewhere
        raise CheckpointError(f"checkpoint {ckpt}: role {role!r} leads outside the "
                              f"checkpoint; refusing to export it")
    if not os.path.isdir(source):
        raise FileNotFoundError(f"checkpoint {ckpt} has no role '{role}' "
                                f"(it has {sorted(os.listdir(ckpt))})")
    verify_checkpoint(ckpt)
    if os.path.exists(out) and not os.path.isdir(out):
        raise NotADirectoryError(f"OUT {out!r} is a file; give a directory (it is created "
                                 f"if missing)")
    if _inside(os.path.join(run_dir, "checkpoints"), out):  # would copy files onto themselves
        raise CheckpointError(f"OUT {out!r} is inside the run's checkpoints; export to a "
                              f"directory outside {os.path.join(run_dir, 'checkpoints')}")
    with _staged(out) as stage:
        _write_export(run_dir, ckpt, role, source, stage, merge, max_shard_bytes)
        if not any(_is_weights(name) for name in os.listdir(stage)):
            raise CheckpointError(f"checkpoint {ckpt}: role '{role}' holds no weights to "
                                  f"export (no {role}/dcp/.metadata, no "
                                  f"{role}/model.safetensors); nothing was written")
    return ckpt


class ExportIntoExistingWarning(DeprecationWarning):
    """`hybridflow export` into a directory that already holds files."""


warnings.filterwarnings("default", category=ExportIntoExistingWarning)  # a CLI's users


def _is_weights(name: str) -> bool:
    return name.endswith((".safetensors", ".bin")) or name.endswith(".index.json")


@contextlib.contextmanager
def _staged(out: str):
    """A hidden folder beside OUT to write into; renamed to OUT when the block ends
    well, removed (with any parent folder made for it) when it does not."""
    out = os.path.abspath(out)
    parent, made = os.path.dirname(out), None
    if not os.path.isdir(parent):
        made = parent
        while not os.path.isdir(os.path.dirname(made)):
            made = os.path.dirname(made)
        os.makedirs(parent)
    stage = tempfile.mkdtemp(prefix=f".{os.path.basename(out)}.export-", dir=parent)
    try:
        yield stage
        _publish(stage, out)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        if made:
            shutil.rmtree(made, ignore_errors=True)
        raise


def _publish(stage: str, out: str) -> None:
    if not os.path.isdir(out) or not os.listdir(out):
        os.replace(stage, out)  # an empty directory is replaced whole
        return
    warnings.warn(f"OUT {out!r} already holds files: exporting into it is deprecated and "
                  f"refused from the next release; give a new directory",
                  ExportIntoExistingWarning, stacklevel=4)
    for name in os.listdir(stage):
        target = os.path.join(out, name)
        if os.path.isdir(target) and not os.path.islink(target):
            shutil.rmtree(target)
        os.replace(os.path.join(stage, name), target)
    os.rmdir(stage)


def _write_export(run_dir: str, ckpt: str, role: str, source: str, out: str, merge: bool,
                  max_shard_bytes: int) -> None:
    if merge and os.path.isfile(os.path.join(source, "adapter_config.json")):
        from hybridflow.program.run_record import read_run_config
        from hybridflow.workers.lora import merge_checkpoint
        cfg = read_run_config(run_dir)
        merge_checkpoint(source, cfg, int(cfg.trainer.seed), out)
        return
    adapters = os.path.isfile(os.path.join(source, "adapter_config.json"))
    for name in os.listdir(source):
        path = os.path.join(source, name)
        if not is_model_file(name) or os.path.isdir(path):  # dcp/: read below
            continue
        if not _inside(ckpt, path):
            raise CheckpointError(f"checkpoint {ckpt}: {role}/{name} links outside the "
                                  f"checkpoint; refusing to export it")
        if name == "model.safetensors" and os.path.getsize(path) > max_shard_bytes:
            continue  # resharded below
        shutil.copy2(path, os.path.join(out, name))
    if not adapters and _needs_rewrite(source, max_shard_bytes):
        from hybridflow.workers.hf_export import write_checkpoint_weights
        write_checkpoint_weights(source, out, min(_READ_BUCKET_BYTES, max_shard_bytes),
                                 max_shard_bytes)


def _needs_rewrite(source: str, max_shard_bytes: int) -> bool:
    """A sharded checkpoint, or an old single file past the shard limit."""
    from hybridflow.workers.parallel.sharded_checkpoint import is_sharded_checkpoint
    single = os.path.join(source, "model.safetensors")
    return is_sharded_checkpoint(source) or \
        (os.path.isfile(single) and os.path.getsize(single) > max_shard_bytes)


def is_model_file(name: str) -> bool:
    """What a Hugging Face model directory holds: not a run's optimizer, scheduler or
    RNG state (rng_rank0.safetensors would pass for weights by its extension)."""
    return not name.startswith(_TRAINING_STATE)


def run(args) -> int:
    from hybridflow.core.loading import UserFileError
    try:
        ckpt = export_role(args.run_dir, args.out, args.role,
                           merge=not getattr(args, "adapter_only", False),
                           max_shard_bytes=parse_size(getattr(args, "max_shard_size", "5GB")))
    except (FileNotFoundError, NotADirectoryError, CheckpointError, UserFileError) as err:
        echo(f"hybridflow export: {err}", file=sys.stderr)
        return 1
    echo(f"exported role '{args.role}' from {ckpt} to {args.out}")
    return 0
