"""Hugging Face directories written bucket by bucket (hybridflow/workers/hf_export.py):
one file under the shard limit, `model-0000k-of-0000N.safetensors` with their index past
it, a tied head written once, and the same model back from `from_pretrained`, whether
the weights come from a live module or from a sharded (DCP) checkpoint."""
import json
import os
import shutil

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from tests.support.workers import TINY, make_cfg, rollout_for_update
from hybridflow.workers import ActorWorker
from hybridflow.workers.hf_export import (INDEX_FILE, dcp_tensors, write_checkpoint_weights,
                                          write_hf_shards, write_module)


def _model(tied: bool, seed: int = 0):
    torch.manual_seed(seed)
    config = AutoConfig.for_model(**{**TINY, "tie_word_embeddings": tied, "vocab_size": 40})
    return AutoModelForCausalLM.from_config(config)


def _same_weights(a, b):
    sa, sb = a.state_dict(), b.state_dict()
    assert set(sa) == set(sb)
    for key, value in sa.items():
        assert torch.equal(sb[key], value), key


@pytest.mark.parametrize("tied", [False, True])
def test_a_module_past_the_shard_limit_is_written_as_indexed_shards(tmp_path, tied):
    model = _model(tied)
    write_module(model, str(tmp_path), rank=0, bucket_bytes=4096, max_shard_bytes=20_000)
    index = json.load(open(tmp_path / INDEX_FILE))
    files = sorted(set(index["weight_map"].values()))
    assert len(files) > 2 and files[0] == f"model-00001-of-{len(files):05d}.safetensors"
    assert sorted(f for f in os.listdir(tmp_path) if f.endswith(".safetensors")) == files
    assert all(os.path.getsize(tmp_path / f) < 20_000 + 4096 for f in files)
    assert ("lm_head.weight" in index["weight_map"]) is not tied  # tied: written once
    _same_weights(model, AutoModelForCausalLM.from_pretrained(tmp_path))


def test_under_the_limit_it_is_one_file_and_a_bad_limit_is_refused(tmp_path):
    write_hf_shards([("a", torch.ones(3))], str(tmp_path))
    assert os.listdir(tmp_path) == ["model.safetensors"]
    with pytest.raises(ValueError, match="max shard size"):
        write_hf_shards([("a", torch.ones(3))], str(tmp_path), max_shard_bytes=0)


def test_a_sharded_checkpoint_exports_the_trained_weights(tmp_path):
    actor = ActorWorker(make_cfg(actor={"lr": 1e-2, "strategy": "fsdp2"}))
    actor.update(rollout_for_update(actor, n=1))
    actor.save_checkpoint(str(tmp_path / "actor"))
    assert "model.safetensors" not in os.listdir(tmp_path / "actor")  # DCP shards only
    read = dict(dcp_tensors(str(tmp_path / "actor" / "dcp"), bucket_bytes=2048))
    trained = actor.module.state_dict()
    assert set(read) == set(trained)  # plain names, no optimizer state
    files = write_checkpoint_weights(str(tmp_path / "actor"), str(tmp_path / "hf"),
                                     bucket_bytes=2048, max_shard_bytes=30_000)
    assert len(files) > 1 and os.path.isfile(tmp_path / "hf" / INDEX_FILE)
    shutil.copy(tmp_path / "actor" / "config.json", tmp_path / "hf")  # as export copies it
    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "hf")
    _same_weights(actor.module, exported)
