"""Defaults that tell: a run on the user's model that keeps the toy-sized keys gets
one note naming them; the toy run itself and a fully sized config get none."""
from hybridflow.cli import main
from hybridflow.program.assemble import prepare
from hybridflow.run.lifecycle import explicit_keys
from hybridflow.program.toy_defaults import TOY_SIZED_KEYS, toy_defaults_note
from graphs.common import TOY_BASE

GRPO = "graphs/grpo.py"


def _note(overrides, yaml_file=None):
    loaded = prepare(GRPO, overrides, yaml_file, preflight=False)
    return toy_defaults_note(loaded.cfg, explicit_keys(overrides, yaml_file))


def test_the_toy_run_gets_no_note():
    assert _note([]) is None


def test_a_users_model_with_toy_sizes_is_told_which_keys_are_the_toys():
    note = _note([f"model.path={TOY_BASE}", "actor.lr=1e-6"])
    for key in TOY_SIZED_KEYS:
        assert (key in note) == (key != "actor.lr"), key
    assert "data.max_prompt_length=8" in note and "sized for the toy model" in note


def test_every_key_set_in_a_config_file_silences_it(tmp_path):
    yaml = tmp_path / "c.yaml"
    yaml.write_text("data: {max_prompt_length: 32, batch_size: 4}\n"
                    "rollout: {max_new_tokens: 8}\n"
                    "actor: {lr: 1.0e-6, mini_batch_size: 32, micro_batch_size: 8}\n")
    assert _note([f"model.path={TOY_BASE}"], str(yaml)) is None


def test_hybridflow_run_prints_the_note_once_before_its_launch_checks(tmp_path, capsys,
                                                                      monkeypatch):
    from hybridflow.memory import report
    monkeypatch.setattr(report, "machine_memory_bytes", lambda: 2 ** 20)  # refused next
    code = main(["run", GRPO, f"model.path={TOY_BASE}", f"trainer.runs_dir={tmp_path}"])
    err = capsys.readouterr().err
    assert code == 1
    assert err.count("sized for the toy model") == 1
    assert err.index("sized for the toy model") < err.index("does not fit")


def test_hybridflow_run_says_what_model_dtype_auto_chose(tmp_path, capsys, monkeypatch):
    import torch

    from hybridflow.memory import report
    monkeypatch.setattr(report, "machine_memory_bytes", lambda: 2 ** 20)  # stops at launch
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    for native, chosen in ((False, "float32"), (True, "bfloat16")):
        monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda n=native: n)
        monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda n=native: n)
        main(["run", GRPO, "model.dtype=auto", f"trainer.runs_dir={tmp_path}"])
        assert f"note: model.dtype=auto -> {chosen}" in capsys.readouterr().err
