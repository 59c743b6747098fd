"""A trained role's checkpoint, saved by every rank with `torch.distributed.checkpoint`
(DCP): no rank gathers the model, and a checkpoint resumes onto another layout.

    <role>/dcp/.metadata          DCP's index: every tensor's global shape and which
    <role>/dcp/__<rank>_0.distcp  chunks each rank wrote (its shards of the weights
                                  and of the optimizer state, under their FQNs)
    <role>/scheduler.pt           the LR schedule (weights_only torch.save), rank 0
    <role>/config.json, tokenizer the model's HF config and tokenizer, rank 0 (export)
    <role>/adapter_*              LoRA runs: the adapters, rank 0 (peft's layout)

`get_state_dict` names every tensor by its FQN and keeps DTensors as they are (any
placement: FSDP2's Shard(0), tensor parallelism's Shard/Replicate on a 2-D mesh), so
`dcp.load` reshards on load, the AdamW moments with the weights: a checkpoint saved by
2 FSDP ranks loads on 1 and back, and one saved at dp=2 loads at dp=1 x tp=2, and back,
and at tp=2 on one rank (`tests/workers/test_sharded_checkpoint_tp.py`).
LoRA runs save only the trainable adapters (and their optimizer state); the frozen
base is what `model.path` (or the seeded build) gives, as before.

The run's checkpoint (`hybridflow/run/checkpoint.py`) lists these files in its
manifest with their sha256 and writes them under a temporary name first, so a damaged
shard is named on resume. Every read goes through `workers/parallel/safe_dcp.py` (nothing in a
checkpoint is unpickled beyond DCP's metadata classes, tensors and plain values; a
missing or short shard is named), `scheduler.pt` through `core/loading.read_torch`;
a save that fails is one `CheckpointSaveError` naming the directory and the cause.
Checkpoints from before (`model.safetensors` or adapter files, plus `optim_rank<r>.pt`
per rank) still load, at the world size they were saved at and tp=1 (the format
predates tensor parallelism). Every rank of the role calls save and load
(collectives). Stateless.
"""
from __future__ import annotations

import glob
import os
import warnings
from contextlib import contextmanager

import torch

__all__ = ["DCP_DIR", "SCHEDULER_FILE", "CheckpointSaveError", "is_sharded_checkpoint",
           "save_trainer", "load_trainer"]

DCP_DIR = "dcp"
SCHEDULER_FILE = "scheduler.pt"


def is_sharded_checkpoint(directory: str) -> bool:
    """A DCP checkpoint: its index is there. A `dcp/` folder without it is a damaged
    one (refused by name), not the old format."""
    index = os.path.join(directory, DCP_DIR, ".metadata")
    if os.path.isdir(os.path.join(directory, DCP_DIR)) and not os.path.lexists(index):
        from hybridflow.workers.parallel.safe_dcp import CheckpointFileError
        raise CheckpointFileError(f"checkpoint file {index!r} is missing: the shards "
                                  f"beside it cannot be read without their index; resume "
                                  f"from the checkpoint before it, or save this one again",
                                  index)
    return os.path.lexists(index)


def _options(module):
    from torch.distributed.checkpoint.state_dict import StateDictOptions
    from hybridflow.workers.lora import is_lora
    lora = is_lora(module)  # the frozen base is not in the checkpoint: load non-strict
    return StateDictOptions(ignore_frozen_params=lora, strict=not lora)


def _state(trainer) -> dict:
    from torch.distributed.checkpoint.state_dict import get_state_dict
    model, optim = get_state_dict(trainer.module, trainer.optimizer,
                                  options=_options(trainer.module))
    return {"model": model, "optim": optim}


@contextmanager
def _one_process_quiet():
    """DCP warns on every save or load of one rank without a process group that it
    'assumes the intent is' one process: it is, so say nothing."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*assuming the intent is to",
                                category=UserWarning)
        yield


class CheckpointSaveError(RuntimeError):
    """A save that failed (a full disk, a lost directory): one line naming the
    directory and the cause, instead of DCP's per-rank tracebacks."""


def save_trainer(trainer, directory: str, rank: int, tokenizer=None) -> None:
    """Every rank writes its shards; rank 0 also the schedule, config and tokenizer.
    A failure is a CheckpointSaveError; the run's checkpoint (run/checkpoint.py) then
    removes its temporary directory, so nothing half-written looks complete."""
    try:
        _save(trainer, directory, rank, tokenizer)
    except CheckpointSaveError:
        raise
    except BaseException as err:  # DCP wraps every rank's failure (a BaseException)
        from torch.distributed.checkpoint.api import CheckpointException
        if not isinstance(err, (Exception, CheckpointException)):
            raise  # KeyboardInterrupt, SystemExit: not a failed write
        raise CheckpointSaveError(f"could not save checkpoint {directory!r}: "
                                  f"{_save_cause(err, directory)}; free space there (or "
                                  f"point trainer.runs_dir elsewhere) and resume from the "
                                  f"checkpoint before it") from None


def _save_cause(err: BaseException, directory: str) -> str:
    """What made a write fail, in a few words: the OSError behind it, or, for torch's
    zip writer cut short by a full disk ('enforce fail ... unexpected pos'), the space."""
    import shutil
    from torch.distributed.checkpoint.api import CheckpointException
    causes = [e for e, _ in err.failures.values()] if isinstance(err, CheckpointException) \
        else [err]
    chain = []
    for exc in causes:
        while exc is not None and exc not in chain:
            chain.append(exc)
            exc = exc.__cause__ or exc.__context__
    for exc in chain:
        if isinstance(exc, OSError) and exc.strerror:
            where = f" ({exc.filename})" if exc.filename else ""
            return f"OSError: {exc.strerror}{where}"
    try:
        free = shutil.disk_usage(directory if os.path.isdir(directory) else
                                 os.path.dirname(directory) or ".").free
    except OSError:
        free = None
    if free is not None and free < (1 << 20):
        return f"OSError: No space left on device ({free} bytes free there)"
    lines = str(causes[0]).strip().splitlines()
    return f"{type(causes[0]).__name__}: {lines[0][:200]}" if lines else type(causes[0]).__name__


def _save(trainer, directory: str, rank: int, tokenizer=None) -> None:
    import torch.distributed.checkpoint as dcp
    from hybridflow.workers.lora import is_lora
    os.makedirs(directory, exist_ok=True)
    with _one_process_quiet():
        dcp.save(_state(trainer), checkpoint_id=os.path.join(directory, DCP_DIR),
                 no_dist=trainer.world == 1)
    module = trainer.module
    adapters = _gathered_adapters(module) if is_lora(module) else None  # collective
    if rank != 0:
        return
    torch.save({"scheduler": trainer.scheduler.state_dict()},
               os.path.join(directory, SCHEDULER_FILE))
    if adapters is not None:
        from hybridflow.workers.lora import save_adapter
        save_adapter(module, directory, adapters)
    else:
        config = getattr(module, "config", None)
        if config is not None and hasattr(config, "save_pretrained"):
            config.save_pretrained(directory)
    if tokenizer is not None:
        tokenizer.save_pretrained(directory)


def _gathered_adapters(module) -> dict:
    """The trainable tensors (LoRA's adapters: small) gathered whole, on rank 0."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
    from hybridflow.workers.weights import is_sharded
    if not is_sharded(module):
        return {k: v.detach() for k, v in module.state_dict().items() if "lora_" in k}
    return get_model_state_dict(module, options=StateDictOptions(
        full_state_dict=True, cpu_offload=True, ignore_frozen_params=True))


def load_trainer(trainer, directory: str, rank: int, world: int) -> None:
    """Restore weights, optimizer and schedule from `directory`: a DCP checkpoint at any
    layout, or one of the older format at the world size it was saved with (tp=1)."""
    if not is_sharded_checkpoint(directory):
        _check_old_layout(directory, world, trainer.world // max(1, trainer.dp))
        trainer.load(directory, rank)
        return
    from torch.distributed.checkpoint.api import CheckpointException
    from torch.distributed.checkpoint.state_dict import set_state_dict
    from hybridflow.core.loading import UserFileError, read_torch
    from hybridflow.workers.parallel.safe_dcp import FIX, load_dcp
    path = os.path.join(directory, SCHEDULER_FILE)
    if not os.path.isfile(path):  # before the shards: nothing is loaded from a damaged one
        raise FileNotFoundError(f"checkpoint {directory!r} has {DCP_DIR}/ but no "
                                f"{SCHEDULER_FILE}: it is damaged; resume from the one "
                                f"before it")
    state = _state(trainer)  # this layout's (sharded) tensors, filled in place
    try:
        with _one_process_quiet():
            load_dcp(state, os.path.join(directory, DCP_DIR), no_dist=trainer.world == 1)
    except UserFileError:  # a file missing, short or refused: named by safe_dcp
        raise
    except (CheckpointException, RuntimeError, KeyError, ValueError) as err:  # keys, shapes
        raise ValueError(
            f"checkpoint {directory!r} ({DCP_DIR}/) does not fit this role's model and "
            f"optimizer (another model, or LoRA on one side only?): "
            f"{_first_line(err)}") from None
    set_state_dict(trainer.module, trainer.optimizer, model_state_dict=state["model"],
                   optim_state_dict=state["optim"], options=_options(trainer.module))
    schedule = read_torch(path, "checkpoint schedule", fix=FIX)
    if not isinstance(schedule, dict) or "scheduler" not in schedule:
        raise ValueError(f"checkpoint schedule {path!r} lacks its 'scheduler' entry; {FIX}")
    trainer.scheduler.load_state_dict(schedule["scheduler"])


def _first_line(err: BaseException) -> str:
    """The cause DCP reports, without its tracebacks (a CheckpointException's text is
    every rank's traceback)."""
    from torch.distributed.checkpoint.api import CheckpointException
    if isinstance(err, CheckpointException):
        err = next(iter(err.failures.values()))[0]
    lines = str(err).strip().splitlines()
    return f"{type(err).__name__}: {lines[0][:300]}" if lines else type(err).__name__


def _check_old_layout(directory: str, world: int, tp: int) -> None:
    """An old checkpoint (per-rank optimizer files) resumes only at its layout: its
    world size, without tensor parallelism (the format predates it: every old
    checkpoint was saved at dp = its number of files x tp=1, and each file holds that
    rank's data-parallel shard, which no tensor-parallel rank's shard matches)."""
    saved = sorted(glob.glob(os.path.join(directory, "optim_rank*.pt")))
    what = (f"is in the format from before sharded checkpoints (model.safetensors + "
            f"{len(saved)} optim_rank<r>.pt files)")
    if tp > 1:
        layout = f"dp={len(saved)} x tp=1" if saved else "no layout (no optim_rank<r>.pt)"
        raise ValueError(
            f"checkpoint {directory!r} {what}: saved at {layout}, and this role runs "
            f"{_layout_text(world, tp)}. Only sharded (DCP) checkpoints reshard onto "
            f"another tensor-parallel layout: resume it once at "
            f"placement.parallel.<role>.dp={max(1, len(saved))} tp=1 and save again, or "
            f"`hybridflow export` its weights and start a new run from them (model.path)")
    if saved and len(saved) != world:
        raise ValueError(
            f"checkpoint {directory!r} {what}: it resumes only on "
            f"{len(saved)} rank(s), and this role has {world}. Resume with {len(saved)} "
            f"rank(s) once and save again (new checkpoints reshard), or `hybridflow export` "
            f"its weights and start a new run from them (model.path)")


def _layout_text(world: int, tp: int) -> str:
    from hybridflow.core.layout import RoleLayout
    layout = RoleLayout(world, tp)
    return f"dp={layout.dp} x tp={layout.tp}"
