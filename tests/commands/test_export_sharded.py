"""`hybridflow export` of a run whose checkpoint is sharded (DCP): the Hugging Face
directory holds the trained weights (safetensors shards with their index past
--max-shard-size), the config and tokenizer, and none of the training state; an old
checkpoint's single file past the limit is resharded the same way."""
import json
import os

import pytest
import torch
from transformers import AutoModelForCausalLM

from tests.support.recorded_runs import fabricate_run
from tests.support.workers import make_cfg, rollout_for_update
from hybridflow.cli import main
from hybridflow.run.checkpoint import save_checkpoint
from hybridflow.workers import ActorWorker

INDEX = "model.safetensors.index.json"


def _run_with_sharded_checkpoint(tmp_path) -> tuple[str, ActorWorker]:
    actor = ActorWorker(make_cfg(actor={"lr": 1e-2}))
    actor.update(rollout_for_update(actor, n=1))
    run = tmp_path / "run"
    save_checkpoint(str(run / "checkpoints"), 1,
                    lambda root: actor.save_checkpoint(os.path.join(root, "actor")), {})
    return str(run), actor


def test_a_sharded_checkpoint_exports_as_indexed_shards_that_load(tmp_path):
    run, actor = _run_with_sharded_checkpoint(tmp_path)
    out = tmp_path / "hf"
    assert main(["export", run, str(out), "--max-shard-size", "30KB"]) == 0
    names = sorted(os.listdir(out))
    shards = [n for n in names if n.startswith("model-")]
    assert len(shards) > 1 and INDEX in names and "config.json" in names
    assert not any(n.startswith(("optim", "rng_", "scheduler", "dcp")) for n in names)
    assert set(json.load(open(out / INDEX))["weight_map"].values()) == set(shards)
    exported = AutoModelForCausalLM.from_pretrained(out).state_dict()
    for key, value in actor.module.state_dict().items():
        assert torch.equal(exported[key], value), key


def test_an_old_checkpoint_past_the_limit_is_resharded(tmp_path):
    folder = fabricate_run(tmp_path / "run")  # the toy model's one model.safetensors
    out = tmp_path / "hf"
    assert main(["export", folder, str(out), "--max-shard-size", "0.02MB"]) == 0
    assert os.path.isfile(out / INDEX) and not os.path.exists(out / "model.safetensors")
    toy = AutoModelForCausalLM.from_pretrained(
        os.path.join(folder, "checkpoints", "step_000003", "actor")).state_dict()
    exported = AutoModelForCausalLM.from_pretrained(out).state_dict()
    assert all(torch.equal(exported[k], v) for k, v in toy.items())


@pytest.mark.parametrize("size", ["lots", "0", "-5GB"])
def test_a_bad_shard_size_is_one_line(capsys, tmp_path, size):
    folder = fabricate_run(tmp_path / "run")
    assert main(["export", folder, str(tmp_path / "hf"), f"--max-shard-size={size}"]) == 1
    assert "--max-shard-size" in capsys.readouterr().err


def test_export_of_a_sharded_checkpoint_prints_no_single_process_warning(tmp_path, capsys):
    """DCP warns on a load without a process group that it 'assumes the intent is' one
    process; export reads in one process by design, so it says nothing (issue 36)."""
    import warnings
    run, _ = _run_with_sharded_checkpoint(tmp_path)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert main(["export", run, str(tmp_path / "hf"), "--max-shard-size", "30KB"]) == 0
    said = [str(w.message) for w in caught if issubclass(w.category, UserWarning)]
    assert not [s for s in said if "assuming the intent" in s], said
    assert "assuming the intent" not in capsys.readouterr().err
