"""Class: checkpoint contents are validated, not only their checksums (issue 32, class 6).

Every field of a checkpoint's trainer_state.json (hybridflow/run/trainer_state.py) is
given a wrong type, a value out of range, and (for ids) an id that does not exist:
each is one UserFileError naming the file, the field and its value. The issue's case
end to end: a streaming checkpoint whose state was edited and whose manifest was
rewritten to match is refused on resume, naming `stream_skip[0]`.
"""
from __future__ import annotations

import copy
import json
import os

import pytest

from hybridflow.cli import main
from hybridflow.core.loading import UserFileError
from hybridflow.run.checkpoint import _manifest, capture_rng, load_trainer_state
from hybridflow.run.trainer_state import FIELDS, check_against_run, check_trainer_state
from tests.support.e2e import graph_file

PATH = "/runs/x/checkpoints/step_000002/trainer_state.json"


def _valid() -> dict:
    return {"step": 2, "loader": {"epoch": 0, "cursor": 8, "served": 8},
            "stream_skip": ["u9", "u11"], "nodes": {"kl_ctl": {"beta": 0.1}},
            "rng": json.loads(json.dumps(capture_rng()))}


def _set(state: dict, field: str, value) -> dict:
    """A copy of `state` with the dotted/indexed `field` set (or removed: ...)."""
    out = copy.deepcopy(state)
    *parents, last = field.replace("]", "").replace("[", ".").split(".")
    node = out
    for key in parents:
        node = node[int(key)] if isinstance(node, list) else node[key]
    key = int(last) if isinstance(node, list) else last
    if value is ...:
        del node[key]
    else:
        node[key] = value
    return out


# field -> bad values of each kind (wrong type, out of range, unknown id, missing)
BAD = {
    "step": ["2", 2.5, True, 0, -1, 3, ...],  # 3: not the directory's step
    "loader": [[], "x", ...],
    "loader.epoch": ["0", -1, None, ...],
    "loader.cursor": [1.5, -3, ...],
    "loader.served": [None, -1],  # absent in older checkpoints: 0
    "loader.extra": [1],
    "stream_skip": ["u9", {"u9": 1}],
    "stream_skip[0]": ["zzz", 42, None, "u3", "u11", "v9", "u-1"],  # u3: before served
    "nodes": [[], 1],
    "nodes.kl_ctl": [0.1, [0.1]],
    "rng": [[], ...],
    "rng.python": [[3], "x", ...],
    "rng.python[0]": [2, "3"],
    "rng.python[1][0]": [-1, 2 ** 32, 1.5],
    "rng.python[1][624]": [625, -1],
    "rng.python[2]": ["x"],
    "rng.numpy": [["MT19937"], ...],
    "rng.numpy[0]": ["PCG64"],
    "rng.numpy[1][5]": ["x", -5],
    "rng.numpy[2]": [700, -1],
    "rng.numpy[3]": [2],
    "rng.numpy[4]": ["x"],
    "unknown_field": [1],
}


def test_the_sweep_reaches_every_field_of_the_state():
    assert set(FIELDS) == set(_valid())
    assert set(FIELDS) <= {f.split(".")[0].split("[")[0] for f in BAD}


def test_a_valid_state_passes():
    check_trainer_state(_valid(), PATH)
    check_against_run(_valid(), PATH, 16, {"kl_ctl"})


@pytest.mark.parametrize("field,value", [(f, v) for f, values in BAD.items() for v in values])
def test_every_field_wrong_type_or_out_of_range_is_named(field, value):
    bad = _set(_valid(), field, value)
    with pytest.raises(UserFileError) as err:
        check_trainer_state(bad, PATH)
    message = str(err.value)
    assert message.startswith(f"checkpoint state {PATH!r}: field '")
    named = message.split("field '")[1].split("'")[0]
    top = field.split(".")[0].split("[")[0]
    assert named.split(".")[0].split("[")[0] == top, (named, field)
    assert "delete /runs/x/checkpoints/step_000002 to resume" in message


@pytest.mark.parametrize("field,value,rows,nodes,why", [
    ("loader.cursor", 17, 16, {"kl_ctl"}, "out of range (must be in [0, 16])"),
    ("nodes.other", {"beta": 1.0}, 16, {"kl_ctl"}, "not a stateful node of this graph "
                                                   "(stateful nodes: kl_ctl)"),
    ("nodes.kl_ctl", {"beta": 1.0}, 16, set(), "(stateful nodes: none)"),
])
def test_ids_and_positions_that_do_not_exist_in_this_run_are_named(field, value, rows,
                                                                   nodes, why):
    with pytest.raises(UserFileError) as err:
        check_against_run(_set(_valid(), field, value), PATH, rows, nodes)
    assert f"field '{field}'" in str(err.value) and why in str(err.value)


@pytest.mark.slow  # two streaming runs
def test_an_edited_streaming_checkpoint_with_a_matching_manifest_is_refused(capsys,
                                                                            tmp_path):
    args = [f"trainer.runs_dir={tmp_path}", "trainer.run_name=run", "trainer.val_every=0",
            "trainer.progress=false", "trainer.async_mode=streaming", "trainer.staleness=1",
            "actor.off_policy=decoupled", "data.batch_size=4", "rollout.n=2",
            "actor.mini_batch_size=8", "actor.micro_batch_size=8"]
    assert main(["run", graph_file("grpo"), *args, "trainer.steps=1"]) == 0
    ckpt = tmp_path / "run" / "checkpoints" / "step_000001"
    load_trainer_state(str(ckpt))  # what the run wrote passes
    state_file = ckpt / "trainer_state.json"
    state = json.loads(state_file.read_text())
    state["stream_skip"] = ["zzz", 42, None]
    state_file.write_text(json.dumps(state))
    os.remove(ckpt / "manifest.json")  # rewritten to match: checksums prove nothing now
    (ckpt / "manifest.json").write_text(json.dumps(_manifest(str(ckpt), 1)))
    capsys.readouterr()
    code = main(["run", graph_file("grpo"), "--resume", str(tmp_path / "run"), *args,
                 "trainer.steps=2"])
    err = capsys.readouterr().err
    assert code == 1
    assert (f"hybridflow run: could not resume: checkpoint state '{state_file}': field "
            f"'stream_skip[0]' is 'zzz': not a prompt id of the loader (u<N>)") in err
