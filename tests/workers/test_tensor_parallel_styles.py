"""Issue 36, item 3: every tensor-parallel style transformers' plans use is translated
to what the worker applies, or the project's own plan for the model type is used, or
the run is refused before launch naming the style -- swept over transformers' own
registry of styles (the installed release's), and the Llama plan of the release vLLM
pins (`embed_tokens: embedding_rowwise`), with `check` running the worker's code."""
import pytest
import torch

from hybridflow.cli import main
from hybridflow.workers.parallel.tensor_parallel import (LLAMA_PLAN, TRANSLATED, WHOLE,
                                                         layer_plan, tensor_parallel_plan)
from tests.support.recorded_runs import graph_path


def _registry() -> list[str]:
    from transformers.distributed import tensor_parallel as hf_tp
    return sorted(hf_tp.ALL_PARALLEL_STYLES.keys())


def _tiny(model_type: str = "llama"):
    from transformers import AutoConfig, AutoModelForCausalLM
    config = AutoConfig.for_model(model_type, hidden_size=16, intermediate_size=32,
                                  num_hidden_layers=1, num_attention_heads=2,
                                  num_key_value_heads=2, vocab_size=12)
    return AutoModelForCausalLM.from_config(config)


def test_transformers_registry_is_read():
    styles = _registry()
    assert {"colwise", "rowwise", "embedding_rowwise"} <= set(styles), styles


@pytest.mark.parametrize("style", _registry())
def test_every_style_of_transformers_is_translated_or_gives_way_or_is_refused(
        style, monkeypatch):
    model = _tiny()
    plan = {**LLAMA_PLAN, "layers.*.mlp.down_proj": style}
    monkeypatch.setattr(type(model.config), "base_model_tp_plan", plan)
    if style in TRANSLATED:
        styles = tensor_parallel_plan(model)
        down = "layers.0.mlp.down_proj"
        assert (down in styles) == (style not in WHOLE)
    else:
        assert layer_plan(model) == LLAMA_PLAN  # the project's plan for llama
        monkeypatch.setattr(model.config, "model_type", "llama_like")
        with pytest.raises(ValueError, match=rf"uses style\(s\) \['{style}'\]"):
            tensor_parallel_plan(model)


def test_the_llama_plan_of_vllms_transformers_runs_as_the_projects(monkeypatch):
    """transformers 5.19 (vLLM's) names the embedding `embedding_rowwise` and the
    norms `replicate`: the layers get the same styles, the embedding is sharded once
    (by `parallelize`), the norms stay whole."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel
    model = _tiny()
    plan = {**LLAMA_PLAN, "embed_tokens": "embedding_rowwise", "norm": "replicate",
            "layers.*.input_layernorm": "sequence_parallel"}
    monkeypatch.setattr(type(model.config), "base_model_tp_plan", plan)
    styles = tensor_parallel_plan(model)
    monkeypatch.setattr(type(model.config), "base_model_tp_plan", LLAMA_PLAN)
    assert styles.keys() == tensor_parallel_plan(model).keys()
    assert "embed_tokens" not in styles and "norm" not in styles
    kinds = {name.rsplit(".", 1)[1]: type(style) for name, style in styles.items()}
    assert kinds["q_proj"] is ColwiseParallel and kinds["o_proj"] is RowwiseParallel


def test_check_runs_the_workers_plan_code_on_the_meta_device(tmp_path, capsys):
    """A model type with no plan hybridflow can use (GPT-2) at tp=2: refused by `check`
    (and by `run`, from the same pre-flight) in the worker's words, naming the role."""
    import json

    from safetensors.torch import save_file
    (tmp_path / "config.json").write_text(json.dumps(
        {"model_type": "gpt2", "n_embd": 32, "n_layer": 2, "n_head": 4, "vocab_size": 64,
         "n_positions": 128}))
    save_file({"w": torch.zeros(1)}, str(tmp_path / "model.safetensors"))
    code = main(["check", graph_path("grpo.py"), f"model.path={tmp_path}",
                 "model.tokenizer=char", "runtime.name=ray",
                 "placement.pools.main.devices_per_node=2", "actor.strategy=fsdp2",
                 "placement.parallel.actor.tp=2"])
    err = capsys.readouterr().err.strip()
    assert code == 1
    assert err.startswith("hybridflow check: placement.parallel.actor.tp=2 (model.path")
    assert "model type 'gpt2' ships no tensor-parallel plan" in err
