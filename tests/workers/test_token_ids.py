"""Every model config the project ships or builds agrees with its tokenizer on the
pad/eos/bos ids. vLLM stops on the config's eos as well as the tokenizer's, so a config
whose eos is the tokenizer's <bos> ends rollouts early (and the assembler, looking for
the tokenizer's eos, then masks the padding after it as response)."""
import glob
import json
import os

import pytest

from tests.support.workers import TINY, make_cfg
from hybridflow.workers.config import DEFAULT_HF_CONFIG, ModelConfig, read_section
from hybridflow.workers.models import TOKEN_ID_KEYS, build_causal_lm, build_value_model
from hybridflow.workers.tokenizer import load_tokenizer, tokenizer_spec

ASSETS = os.path.join(os.path.dirname(__file__), "..", "..", "graphs", "assets")
SHIPPED = sorted(os.path.dirname(p) for p in glob.glob(os.path.join(ASSETS, "*", "config.json")))


def _disagreements(config: dict, tokenizer) -> dict:
    return {key: (config.get(key), getattr(tokenizer, key)) for key in TOKEN_ID_KEYS
            if getattr(tokenizer, key) is not None and config.get(key) != getattr(tokenizer, key)}


def test_there_are_shipped_models_to_check():
    assert {os.path.basename(p) for p in SHIPPED} >= {"toy_base", "agent_base"}


@pytest.mark.parametrize("path", SHIPPED, ids=os.path.basename)
def test_shipped_config_ids_are_the_tokenizers(path):
    with open(os.path.join(path, "config.json")) as fh:
        config = json.load(fh)
    assert _disagreements(config, load_tokenizer(path)) == {}, path
    gen = os.path.join(path, "generation_config.json")
    if os.path.exists(gen):
        with open(gen) as fh:
            assert _disagreements(json.load(fh), load_tokenizer(path)) == {}, gen


@pytest.mark.parametrize("hf_config", [TINY, DEFAULT_HF_CONFIG], ids=["tests_tiny", "default"])
def test_models_built_from_a_config_take_the_tokenizers_ids(hf_config):
    cfg = make_cfg()
    cfg["model"]["hf_config"] = dict(hf_config)
    model_cfg = read_section(cfg, "model", ModelConfig)
    tok = load_tokenizer(tokenizer_spec(model_cfg))
    for build in (build_causal_lm, build_value_model):
        config = build(model_cfg, tok, "cpu").config.to_dict()
        assert _disagreements(config, tok) == {}


def test_an_exported_model_directory_keeps_the_tokenizers_ids(tmp_path):
    """A model loaded from a directory whose config disagrees is saved (exported,
    checkpointed) with the tokenizer's ids."""
    from hybridflow.workers.weights import save_weights
    src = SHIPPED[0]
    bad = tmp_path / "bad"
    bad.mkdir()
    for name in os.listdir(src):
        if os.path.isfile(os.path.join(src, name)):
            (bad / name).write_bytes(open(os.path.join(src, name), "rb").read())
    config = json.loads((bad / "config.json").read_text())
    config.update(eos_token_id=2, bos_token_id=1)  # what every shipped config said before
    (bad / "config.json").write_text(json.dumps(config))
    cfg = make_cfg()
    cfg["model"] = {"path": str(bad), "device": "cpu"}
    model_cfg = read_section(cfg, "model", ModelConfig)
    tok = load_tokenizer(tokenizer_spec(model_cfg))
    save_weights(build_causal_lm(model_cfg, tok, "cpu"), str(tmp_path / "out"))
    saved = json.loads((tmp_path / "out" / "config.json").read_text())
    assert _disagreements(saved, tok) == {}
