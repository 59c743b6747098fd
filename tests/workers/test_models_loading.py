"""Loading a model directory whose config.json does not match its weights is an
error naming the directory and the tensors (hybridflow/workers/models.py), never a
half-random model that trains: missing layers, leftover weights, other shapes."""
import json
import os
import shutil

import pytest
import torch

from hybridflow.workers.config import ModelConfig
from hybridflow.workers.models import (
    ModelLoadError,
    build_causal_lm,
    build_reward_model,
    build_value_model,
)
from hybridflow.workers.tokenizer import load_tokenizer

TOY_BASE = os.path.join(os.path.dirname(__file__), "..", "..", "graphs", "assets", "toy_base")


def _copy_with_config(tmp_path, **changes) -> str:
    path = str(tmp_path / "model")
    shutil.copytree(TOY_BASE, path)
    config_file = os.path.join(path, "config.json")
    with open(config_file) as fh:
        config = json.load(fh)
    config.update(changes)
    with open(config_file, "w") as fh:
        json.dump(config, fh)
    return path


def _load(builder, path):
    return builder(ModelConfig(path=path), load_tokenizer(TOY_BASE), torch.device("cpu"),
                   seed=0, path=path)


def test_a_config_with_more_layers_than_its_weights_is_an_error_naming_them(tmp_path):
    path = _copy_with_config(tmp_path, num_hidden_layers=3)
    with pytest.raises(ModelLoadError) as info:
        _load(build_causal_lm, path)
    message = str(info.value)
    assert path in message and "model.layers.2.mlp.up_proj.weight" in message
    assert "missing" in message and "num_hidden_layers" in message


def test_weights_the_config_does_not_use_are_an_error(tmp_path):
    path = _copy_with_config(tmp_path, num_hidden_layers=1)
    with pytest.raises(ModelLoadError, match=r"unexpected.*model\.layers\.1\."):
        _load(build_causal_lm, path)


def test_a_shape_mismatch_names_the_directory_and_both_shapes(tmp_path):
    path = _copy_with_config(tmp_path, intermediate_size=96)
    with pytest.raises(ModelLoadError) as info:
        _load(build_causal_lm, path)
    message = str(info.value)
    assert path in message and "model.layers.0.mlp.up_proj.weight" in message
    assert "(128, 64)" in message and "(96, 64)" in message


def test_a_matching_directory_loads_exactly_its_weights(tmp_path):
    from safetensors.torch import load_file
    model = _load(build_causal_lm, TOY_BASE)
    saved = load_file(os.path.join(TOY_BASE, "model.safetensors"))
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, saved[name]), name


def test_the_critic_may_start_its_value_head_from_a_causal_lm_but_not_miss_layers(tmp_path):
    model = _load(build_value_model, TOY_BASE)  # a new head and no lm_head: expected
    assert model.score.out_features == 1
    with pytest.raises(ModelLoadError, match="model.layers.2"):
        _load(build_value_model, _copy_with_config(tmp_path, num_hidden_layers=3))


def test_a_reward_model_without_a_trained_head_is_an_error(tmp_path):
    with pytest.raises(ModelLoadError, match=r"missing.*score\.weight"):
        _load(build_reward_model, TOY_BASE)


def test_auto_dtype_is_bf16_only_where_bf16_is_native(monkeypatch):
    import torch

    from hybridflow.workers import models
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    for native, want in ((True, torch.bfloat16), (False, torch.float32)):
        monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda n=native: n)
        monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda n=native: n)
        assert models.native_bf16() is native
        assert models.resolve_dtype("auto") == want
    assert models.resolve_dtype("bf16") == torch.bfloat16  # explicit names are kept
    with pytest.raises(ValueError, match="'auto'"):
        models.resolve_dtype("f8")  # the error lists auto among the names


def test_loading_a_model_draws_no_progress_bar_and_leaves_the_setting_as_it_was(capfd):
    """transformers draws a `Loading weights` bar per load: on Ray, every rank of every
    role printed it through the log prefixes on every run (issue 36)."""
    from transformers.utils import logging as hf_logging
    assert hf_logging.is_progress_bar_enabled()
    _load(build_causal_lm, TOY_BASE)
    err = capfd.readouterr().err
    assert "Loading weights" not in err and "Loading checkpoint" not in err, err
    assert hf_logging.is_progress_bar_enabled()  # a user's own loads keep theirs
