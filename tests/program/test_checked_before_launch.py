"""Issue 26, classes 3, 5 (config part), 6 and 8: what can be checked before launch is,
with one line naming the key, row or file -- swept over the class, not one example."""
from __future__ import annotations

import argparse
import os

import pytest
from omegaconf import DictConfig, OmegaConf

from hybridflow.cli import main
from hybridflow.core.constraints import ConfigError
from hybridflow.program.config import RunConfig, build_config
from tests.support.recorded_runs import REPO, graph_path

GRPO = graph_path("grpo.py")
TOY = os.path.join(REPO, "graphs", "assets", "toy_base")


def cli(capsys, *argv) -> tuple[int, list[str]]:
    code = main([str(a) for a in argv])
    err = capsys.readouterr().err
    return code, [line for line in err.splitlines() if line.strip()]


def _sections(node: DictConfig, prefix: str = "") -> list[str]:
    found = []
    for key in node.keys():
        child = node._get_node(key)
        if isinstance(child, DictConfig) and not child._is_none() and not child._is_missing():
            found.append(f"{prefix}{key}")
            found += _sections(child, f"{prefix}{key}.")
    return found


def _leaves(node: DictConfig, prefix: str = "") -> list[str]:
    found = []
    for key in node.keys():
        child = node._get_node(key)
        if isinstance(child, DictConfig):
            if not child._is_none() and not child._is_missing():
                found += _leaves(child, f"{prefix}{key}.")
        else:
            found.append(f"{prefix}{key}")
    return found


DEFAULTS = OmegaConf.structured(RunConfig)
SECTIONS = [s for s in _sections(DEFAULTS) if not s.startswith("algorithm")]
LEAVES = _leaves(DEFAULTS)


# ---------------------------------------------------------------- class 3: sections
@pytest.mark.parametrize("value", ["5", "x", "true"])
@pytest.mark.parametrize("section", SECTIONS)
def test_a_section_given_a_value_is_named_as_a_section(section, value, tmp_path):
    with pytest.raises(ConfigError, match=rf"'{section}' is a section of keys, not a value"):
        build_config(overrides=[f"{section}={value}"])
    path = tmp_path / "c.yaml"
    path.write_text(OmegaConf.to_yaml(OmegaConf.from_dotlist([f"{section}={value}"])))
    with pytest.raises(ConfigError, match=rf"{path}: '{section}' is a section of keys"):
        build_config(yaml_file=str(path))


# ------------------------------------------------------------- class 3: flat keys
def _flat_cases():
    by_leaf: dict[str, list[str]] = {}
    for key in LEAVES:
        if "." in key:
            by_leaf.setdefault(key.rsplit(".", 1)[1], []).append(key)
    return sorted((leaf, keys) for leaf, keys in by_leaf.items() if leaf not in DEFAULTS)


@pytest.mark.parametrize("leaf,keys", _flat_cases(), ids=[c[0] for c in _flat_cases()])
def test_a_key_without_its_section_gets_the_dotted_key(leaf, keys):
    with pytest.raises(ConfigError) as err:
        build_config(overrides=[f"{leaf}=1"])
    message = str(err.value)
    assert "did you mean" in message and "workers." not in message, message
    if len(keys) <= 3:  # a leaf of a few sections: each is offered
        assert all(f"'{k}'" in message for k in keys), message
    else:
        assert any(f"'{k}'" in message for k in keys), message


# ---------------------------------------------------------- class 3: model positions
@pytest.mark.parametrize("prompt,response", [(8, 249), (200, 57), (1, 256), (300, 16),
                                             (256, 1)])
@pytest.mark.parametrize("source", ["model.path", "model.hf_config"])
def test_prompt_and_response_beyond_the_models_positions_fail_check(source, prompt, response,
                                                                    capsys):
    model = [f"model.path={TOY}"] if source == "model.path" else ["model.path=null"]
    code, lines = cli(capsys, "check", GRPO, *model, f"data.max_prompt_length={prompt}",
                      f"rollout.max_new_tokens={response}")
    assert code == 1 and len(lines) == 1, lines
    assert f"data.max_prompt_length={prompt} + rollout.max_new_tokens={response}" in lines[0]
    assert "256 positions" in lines[0]
    assert (os.path.join(TOY, "config.json") if source == "model.path"
            else "model.hf_config") in lines[0]


@pytest.mark.parametrize("key", ["max_position_embeddings", "n_positions",
                                 "max_sequence_length"])
def test_each_way_a_config_states_its_positions_is_read(key, tmp_path, capsys):
    import json
    import shutil
    folder = tmp_path / "m"
    shutil.copytree(TOY, folder)
    config = json.loads((folder / "config.json").read_text())
    del config["max_position_embeddings"]
    config[key] = 20
    (folder / "config.json").write_text(json.dumps(config))
    from hybridflow.program.model_checks import check_positions
    cfg = build_config(overrides=[f"model.path={folder}", "data.max_prompt_length=8",
                                  "rollout.max_new_tokens=13"])
    with pytest.raises(ConfigError, match=f"20 positions of model.path \\({key} in"):
        check_positions(cfg)
    check_positions(build_config(overrides=[f"model.path={folder}", "data.max_prompt_length=8",
                                            "rollout.max_new_tokens=12"]))  # exactly fits


def test_within_the_positions_passes(capsys):
    code, _ = cli(capsys, "check", GRPO, "data.max_prompt_length=200",
                  "rollout.max_new_tokens=56")
    assert code == 0


# ---------------------------------------------------- class 3: unknown characters
UNKNOWN = ["é", "€", "#", "@", "[", "\t", "中", "😀", "~", "_", "ß", "\u00a0"]


@pytest.mark.parametrize("char", UNKNOWN)
def test_characters_the_tokenizer_does_not_know_are_refused_naming_the_row(char):
    from hybridflow.core.data import DataError, PromptDataset
    from hybridflow.workers.tokenizer import build_char_tokenizer
    good = {"data_source": "toy", "prompt": "1+2=", "reward_model": {"ground_truth": "3"}}
    bad = dict(good, prompt=f"1+2{char}=")
    with pytest.raises(DataError) as err:
        PromptDataset([good, bad], build_char_tokenizer(), 16, name="train.jsonl")
    assert str(err.value).startswith("train.jsonl row 1: the tokenizer has no token for "
                                     f"{char!r}"), err.value


def test_chat_messages_with_unknown_characters_are_refused_too():
    from hybridflow.core.data import DataError, PromptDataset
    from hybridflow.workers.tokenizer import build_char_tokenizer
    row = {"data_source": "toy", "prompt": [{"role": "user", "content": "2×3="}],
           "reward_model": {"ground_truth": "6"}}
    with pytest.raises(DataError, match="row 0: the tokenizer has no token for '×'"):
        PromptDataset([row], build_char_tokenizer(), 16, name="d")


# ----------------------------------------------------------- class 3: dropped rows
@pytest.mark.parametrize("overlong", [1, 3, 7])
def test_rows_dropped_as_too_long_are_counted(overlong):
    from hybridflow.core.data import PromptDataset
    from hybridflow.workers.tokenizer import build_char_tokenizer
    rows = [{"data_source": "toy", "prompt": ("1+" * (20 if i < overlong else 1)) + "1=",
             "reward_model": {"ground_truth": "2"}} for i in range(10)]
    data = PromptDataset(rows, build_char_tokenizer(), 16, name="d")
    assert data.dropped == overlong and len(data) == 10 - overlong


@pytest.mark.parametrize("train_drop,val_drop", [(2, 0), (0, 3), (4, 1)])
def test_the_trainer_says_how_many_rows_it_dropped_and_logs_them(train_drop, val_drop):
    """A line at start (run.py prints `trainer.notes`) and step 1's metrics."""
    from types import SimpleNamespace

    from hybridflow.core.data import PromptDataset
    from hybridflow.run.loop import Trainer
    from hybridflow.workers.tokenizer import build_char_tokenizer

    def rows(dropped):
        return [{"data_source": "toy", "prompt": ("1+" * (20 if i < dropped else 1)) + "1=",
                 "reward_model": {"ground_truth": "2"}} for i in range(6)]
    tok = build_char_tokenizer()
    train = PromptDataset(rows(train_drop), tok, 16, name="train.jsonl")
    val = PromptDataset(rows(val_drop), tok, 16, name="val.jsonl")
    trainer = SimpleNamespace(notes=[])
    Trainer._note_dropped(trainer, train, val, 16)
    assert trainer.dropped == {"data/dropped_overlong_train": train_drop,
                               "data/dropped_overlong_val": val_drop}
    expected = [f"{name}: dropped {n} {what} rows longer than data.max_prompt_length=16 "
                f"(kept {6 - n})" for name, n, what in (("train.jsonl", train_drop, "train"),
                                                       ("val.jsonl", val_drop, "validation"))
                if n]
    assert [note.split(";")[0] for note in trainer.notes] == expected


# ------------------------------------------- class 5 (config part): one line, no traceback
BAD_VALUES = [("placement.cluster.device=zzz", "placement.cluster.device: unknown device 'zzz'"),
              ("placement.cluster.device=A100-81G", "unknown device 'A100-81G'"),
              ("placement.cluster.device=", "'placement.cluster.device'"),
              ("trainer.run_name=${nope}", "'trainer.run_name': its interpolation"),
              ("trainer.steps=${trainer.nope}", "'trainer.steps': its interpolation"),
              ("data.batch_size=${data.nothing.here}", "'data.batch_size': its interpolation"),
              ("rollout.n=${oc.env:HYBRIDFLOW_NO_SUCH_VARIABLE}", "'rollout.n': its "
                                                                  "interpolation")]


@pytest.mark.parametrize("command", ["check", "run", "plan"])
@pytest.mark.parametrize("override,words", BAD_VALUES, ids=[b[0] for b in BAD_VALUES])
def test_a_bad_device_or_interpolation_is_one_line(command, override, words, capsys,
                                                   tmp_path):
    extra = [f"trainer.runs_dir={tmp_path}"] if command == "run" else []
    code, lines = cli(capsys, command, GRPO, override, *extra)
    assert code != 0 and len(lines) == 1, lines
    assert lines[0].startswith(f"hybridflow {command}: ") and words in lines[0], lines


# ------------------------------------------------ class 6: accepted without a word
UNTRAINED = {
    "generate and logprob": """
        p = g.source("prompts")
        out = g.call("rollout.generate", p)
        g.call("actor.logprob", out)""",
    "generate, score and logprob": """
        p = g.source("prompts")
        out = g.call("rollout.generate", p)
        g.call("reward.score", out)
        g.call("actor.logprob", out)""",
    "actor and reference inference": """
        p = g.source("prompts")
        out = g.call("actor.generate", p)
        g.call("actor.logprob", out)
        g.call("ref.logprob", out)""",
}


@pytest.mark.parametrize("name", list(UNTRAINED))
def test_run_refuses_a_graph_that_trains_nothing(name, tmp_path, capsys):
    import textwrap
    path = tmp_path / "g.py"
    path.write_text("from hybridflow import Graph\n\n\ndef build(cfg):\n"
                    "    g = Graph('untrained')\n"
                    + textwrap.indent(textwrap.dedent(UNTRAINED[name]).strip(), "    ")
                    + "\n    return g\n")
    code, lines = cli(capsys, "run", path, f"trainer.runs_dir={tmp_path / 'runs'}")
    assert code == 1 and len(lines) == 1 and "has no training node" in lines[0], lines
    assert not (tmp_path / "runs").exists()  # refused before a run directory is made
    assert cli(capsys, "check", path)[0] == 0  # check still shows it (with a warning)


@pytest.mark.parametrize("name", ["MAKER_STRING", "MAKER_NUMBER", "MAKER_TABLE", "MAKER_ROWS"])
def test_a_toy_maker_that_is_not_a_function_fails_check(name, capsys):
    code, lines = cli(capsys, "check", GRPO, f"data.toy.maker=tests.support.named:{name}")
    assert code == 1 and len(lines) == 1, lines
    assert f"data.toy.maker='tests.support.named:{name}'" in lines[0] and "callable" in lines[0]


def test_calibrate_needs_the_device_the_run_ran_on(tmp_path, capsys):
    from tests.support.recorded_runs import fabricate_run
    folder = fabricate_run(tmp_path / "run")
    code, lines = cli(capsys, "plan", "--calibrate", folder)
    assert code == 2 and len(lines) == 1 and "needs --device" in lines[0], lines
    assert cli(capsys, "plan", "--calibrate", folder, "--device", "cpu")[0] == 0


# ------------------------------------------------- class 8: --resume and the next word
def _parse(argv):
    from hybridflow.cli import build_parser
    from hybridflow.commands.run import resume_word
    args = build_parser()[0].parse_args(argv)
    resume_word(args)
    return args


@pytest.mark.parametrize("word", ["trainer.runs_dir=/tmp/x", "trainer.steps=3",
                                  "placement=auto", "data.train_files=a=b.jsonl"])
@pytest.mark.parametrize("before", [[], ["trainer.seed=2"]])
def test_resume_does_not_take_an_override_for_its_run_dir(word, before):
    from hybridflow.commands.run import _NEWEST
    args = _parse(["run", "g.py", *before, "--resume", word])
    assert args.resume == _NEWEST and args.overrides == [*before, word]
    args = _parse(["run", "g.py", "--resume", word, "trainer.val_every=0"])
    assert args.resume == _NEWEST and set(args.overrides) == {word, "trainer.val_every=0"}


def test_resume_still_takes_a_run_dir_even_one_with_an_equals_sign(tmp_path):
    odd = tmp_path / "lr=0.1"
    odd.mkdir()
    for folder in (str(tmp_path), str(odd)):
        args = _parse(["run", "g.py", "--resume", folder, "trainer.steps=3"])
        assert args.resume == folder and args.overrides == ["trainer.steps=3"]
    assert isinstance(_parse(["run", "g.py"]), argparse.Namespace)
