"""Weight files (hybridflow/workers/weights.py): a saved module loads back identical
from its directory, tied weights are written once, a mismatched checkpoint is named,
and the module depends on no other worker module (no training <-> lora cycle)."""
import ast
import os

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from tests.support.workers import TINY
from hybridflow.workers import weights


def _model(tied: bool = False, seed: int = 0):
    torch.manual_seed(seed)
    config = AutoConfig.for_model(**{**TINY, "tie_word_embeddings": tied, "vocab_size": 40})
    return AutoModelForCausalLM.from_config(config)


def test_saved_weights_load_back_identical(tmp_path):
    source, target = _model(seed=0), _model(seed=1)
    weights.save_weights(source, str(tmp_path))
    weights.load_weights(target, str(tmp_path))
    for key, value in source.state_dict().items():
        assert torch.equal(target.state_dict()[key], value), key
    assert AutoModelForCausalLM.from_pretrained(tmp_path).config.hidden_size == 32


def test_tied_weights_are_written_once_and_reload(tmp_path):
    from safetensors.torch import load_file
    source = _model(tied=True)
    weights.save_weights(source, str(tmp_path))
    saved = load_file(os.path.join(tmp_path, weights.WEIGHTS_FILE))
    assert ("lm_head.weight" in saved) != ("model.embed_tokens.weight" in saved)
    target = _model(tied=True, seed=1)
    weights.load_weights(target, str(tmp_path))
    assert torch.equal(target.lm_head.weight, source.lm_head.weight)


def test_a_checkpoint_of_another_model_is_named(tmp_path):
    weights.save_weights(torch.nn.Linear(2, 2), str(tmp_path))
    with pytest.raises(ValueError, match=str(tmp_path)):
        weights.load_weights(_model(), str(tmp_path))
    with pytest.raises(FileNotFoundError, match="model.safetensors"):
        weights.load_weights(_model(), str(tmp_path / "missing"))


def test_weight_files_import_no_other_worker_module():
    tree = ast.parse(open(weights.__file__).read())
    names = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert not any(name and name.startswith("hybridflow.workers") for name in names)
