"""Nothing in a checkpoint runs code (issue 36, class 1): a real checkpoint is written,
then each file a checkpoint reader opens -- DCP's `.metadata`, each shard entry (every
non-tensor entry of the optimizer, a tensor), `scheduler.pt`, the old format's
`optim_rank0.pt`, every other file of the role directory, a batch dump -- is replaced by
(or redirected to) a pickle whose `__reduce__` would create a marker file. Every reader
is driven (a role's `load_checkpoint`, `hybridflow export`, `load_batch`): the marker is
never created, and the one-line error names the file. A control shows the payloads are
live: DCP's own reader runs them. Legitimate checkpoints still load exactly."""
import dataclasses
import io
import os
import pickle
import shutil

import pytest
import torch

from tests.support.workers import make_cfg, rollout_for_update
from hybridflow.core.loading import RefusedFileError, UserFileError
from hybridflow.workers import ActorWorker
from hybridflow.workers.parallel.safe_dcp import METADATA_GLOBALS, read_metadata

CFG = make_cfg(actor={"lr": 1e-2})
READ = {"dcp/.metadata", "dcp/__0_0.distcp", "scheduler.pt", "policy_version.json",
        "rng_rank0.safetensors"}  # what a role's load_checkpoint opens


class Payload:
    """Unpickled, it creates `marker`: proof that code from the file ran."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return exec, (f"open({self.marker!r}, 'w').write('ran')",)


def _pickled(marker: str) -> bytes:
    return pickle.dumps(Payload(marker))


def _torch_saved(marker: str) -> bytes:
    buffer = io.BytesIO()
    torch.save(Payload(marker), buffer)
    return buffer.getvalue()


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A trained actor and its checkpoint (DCP), and the same in the old format."""
    root = tmp_path_factory.mktemp("saved")
    actor = ActorWorker(CFG)
    actor.update(rollout_for_update(actor, n=1))
    actor.save_checkpoint(str(root / "dcp_role"))
    os.makedirs(root / "old_role")
    actor.trainer.save(str(root / "old_role"), 0)  # model.safetensors + optim_rank0.pt
    return root, actor


def _copy(saved, tmp_path, which="dcp_role") -> str:
    root, _ = saved
    role = str(tmp_path / which)
    shutil.copytree(root / which, role)
    return role


def _redirect(role: str, key: str, payload: bytes) -> str:
    """Append `payload` to the shard and point `key`'s entry of a legitimate
    `.metadata` at it (the metadata's own classes only). Returns the shard's path."""
    meta_path = os.path.join(role, "dcp", ".metadata")
    metadata = read_metadata(meta_path)
    shard = os.path.join(role, "dcp", "__0_0.distcp")
    offset = os.path.getsize(shard)
    with open(shard, "ab") as handle:
        handle.write(payload)
    hits = [index for index in metadata.storage_data if index.fqn == key]
    assert hits, key
    for index in hits:
        metadata.storage_data[index] = dataclasses.replace(
            metadata.storage_data[index], offset=offset, length=len(payload))
    with open(meta_path, "wb") as handle:
        pickle.dump(metadata, handle)
    return shard


def _refused_by_every_reader(role: str, marker: str, named: str, export: bool = True):
    with pytest.raises(UserFileError) as err:
        ActorWorker(CFG).load_checkpoint(role)
    _one_line_naming(err.value, named)
    if export:
        from hybridflow.workers.hf_export import write_checkpoint_weights
        with pytest.raises(UserFileError) as err:
            write_checkpoint_weights(role, role + "_hf", bucket_bytes=1 << 20)
        _one_line_naming(err.value, named)
    assert not os.path.exists(marker)


def _one_line_naming(err: BaseException, named: str):
    text = str(err)
    assert named in text and "\n" not in text, text
    assert "weights_only=False" not in text and "weights_only" not in text, text


def _bytes_entries(role: str) -> list[str]:
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata
    meta = read_metadata(os.path.join(role, "dcp", ".metadata")).state_dict_metadata
    return sorted(k for k, v in meta.items() if isinstance(v, BytesStorageMetadata))


def test_the_payloads_are_live_under_dcps_own_reader(saved, tmp_path):
    """The control: DCP's own reader runs both payloads (what the safe reader refuses)."""
    import torch.distributed.checkpoint as dcp
    role = _copy(saved, tmp_path)
    marker = str(tmp_path / "ran_entry")
    _redirect(role, "optim.param_groups.0.lr", _torch_saved(marker))
    state = {"optim": {"param_groups": [{"lr": 0.0}]}}
    try:
        dcp.load(state, checkpoint_id=os.path.join(role, "dcp"), no_dist=True)
    except BaseException:  # noqa: BLE001 - the code has already run by the time it fails
        pass
    assert os.path.exists(marker)
    meta_marker = str(tmp_path / "ran_meta")
    with open(os.path.join(role, "dcp", ".metadata"), "wb") as handle:
        handle.write(_pickled(meta_marker))
    from torch.distributed.checkpoint.api import CheckpointException
    with pytest.raises(CheckpointException):  # exec returned None: no metadata, after it ran
        dcp.load(state, checkpoint_id=os.path.join(role, "dcp"), no_dist=True)
    assert os.path.exists(meta_marker)


def test_a_legitimate_checkpoint_loads_exactly(saved):
    root, actor = saved
    resumed = ActorWorker(CFG)
    resumed.load_checkpoint(str(root / "dcp_role"))
    for key, value in actor.trainer.trained_weights().items():
        assert torch.equal(resumed.trainer.trained_weights()[key], value), key
    want, got = actor.trainer.optimizer.state_dict(), resumed.trainer.optimizer.state_dict()
    assert got["param_groups"] == want["param_groups"]  # every non-tensor entry, typed
    assert resumed.trainer.scheduler.state_dict() == actor.trainer.scheduler.state_dict()


def test_metadata_holding_code_is_refused_naming_the_global(saved, tmp_path):
    role = _copy(saved, tmp_path)
    marker = str(tmp_path / "ran")
    path = os.path.join(role, "dcp", ".metadata")
    with open(path, "wb") as handle:
        handle.write(_pickled(marker))
    _refused_by_every_reader(role, marker, path)
    with pytest.raises(RefusedFileError, match=r"not checkpoint metadata \(builtins.exec\)"):
        read_metadata(path)


def test_every_non_tensor_entry_and_a_tensor_redirected_to_code_is_refused(saved, tmp_path):
    entries = _bytes_entries(str(saved[0] / "dcp_role"))
    assert "optim.param_groups.0.lr" in entries and "optim.param_groups.0.betas" in entries
    for key in entries + ["model.model.embed_tokens.weight", "optim.state."
                          "model.embed_tokens.weight.exp_avg"]:
        case = tmp_path / key
        role = _copy(saved, case)
        marker = str(case / "ran")
        shard = _redirect(role, key, _torch_saved(marker))
        named = f"checkpoint entry {key!r} in {shard!r}" if key in entries else shard
        _refused_by_every_reader(role, marker, named, export=key.startswith("model."))


def test_every_file_of_the_role_replaced_by_code_runs_nothing(saved, tmp_path):
    """Each file in turn, as a raw pickle and as a torch.save zip: whichever reader
    opens it refuses it naming it (a file no reader opens, such as the tokenizer, is
    left unread: the load succeeds)."""
    role_names = sorted(os.path.relpath(os.path.join(d, f), saved[0] / "dcp_role")
                        for d, _, files in os.walk(saved[0] / "dcp_role") for f in files)
    assert READ <= set(role_names)
    for rel in role_names:
        for kind, make in (("pickle", _pickled), ("torch", _torch_saved)):
            case = tmp_path / f"{rel.replace('/', '_')}_{kind}"
            role = _copy(saved, case)
            marker = str(case / "ran")
            with open(os.path.join(role, rel), "wb") as handle:
                handle.write(make(marker))
            try:
                ActorWorker(CFG).load_checkpoint(role)
            except UserFileError as err:
                _one_line_naming(err, os.path.join(role, rel))
            else:
                assert rel not in READ, f"{rel} ({kind}) was read without a word"
            assert not os.path.exists(marker), rel


def test_old_format_optimizer_file_holding_code_is_refused(saved, tmp_path):
    role = _copy(saved, tmp_path, "old_role")
    marker = str(tmp_path / "ran")
    path = os.path.join(role, "optim_rank0.pt")
    with open(path, "wb") as handle:
        handle.write(_torch_saved(marker))
    with pytest.raises(RefusedFileError) as err:
        ActorWorker(CFG).load_checkpoint(role)
    _one_line_naming(err.value, path)
    assert "(builtins.exec)" in str(err.value) and not os.path.exists(marker)


def test_a_batch_dump_holding_code_is_refused(tmp_path):
    from hybridflow.run.batch_dump import load_batch
    marker, path = str(tmp_path / "ran"), str(tmp_path / "actor.update.pt")
    with open(path, "wb") as handle:
        handle.write(_torch_saved(marker))
    with pytest.raises(RefusedFileError) as err:
        load_batch(path)
    _one_line_naming(err.value, path)
    assert not os.path.exists(marker)


def test_the_metadata_allowlist_is_what_dcp_writes(saved):
    """Every global a real `.metadata` names is admitted (and nothing else is needed)."""
    seen = set()

    class Recording(pickle.Unpickler):
        def find_class(self, module, name):
            seen.add((module, name))
            return super().find_class(module, name)

    with open(saved[0] / "dcp_role" / "dcp" / ".metadata", "rb") as handle:
        Recording(handle).load()
    assert seen <= METADATA_GLOBALS, seen - METADATA_GLOBALS
