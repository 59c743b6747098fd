"""Issue 26 class 9: the step loop reads validation scores from the nodes a validation
graph marks (`validation="greedy"` / `"sampled"`), not from nodes of fixed names.
Every way of breaking that contract is refused by `hybridflow check` (and before the
Trainer starts a worker), naming the node and its file:line; a graph that renames its
nodes but marks them trains and validates; metrics of validation nodes are logged."""
from __future__ import annotations

import os
import re
import textwrap

import pytest

from hybridflow.cli import main
from hybridflow.program.assemble import prepare
from hybridflow.program.validation import compile_validation, default_validation_graph
from hybridflow.program.assemble import compile_program
from hybridflow.run.loop import Trainer
from hybridflow.run.tracking import new_run_dir

HEAD = '''
from hybridflow import Batch, Graph, node_fn
from graphs.grpo import ALGORITHM, build, defaults


@node_fn(reads=("scores",), writes=("scores",), overwrites=("scores",), rows=True)
def same(batch):
    return Batch({"scores": batch["scores"].float()})


@node_fn(reads=("responses",), writes=("length",), rows=True)
def length(batch):
    return Batch({"length": batch["responses"].float().sum(-1)})


@node_fn(reads=("input_ids",), writes=("scores",), rows=True)
def ones(batch):
    return Batch({"scores": batch["input_ids"].new_ones(len(batch)).float()})


def validation(cfg):
    g = Graph("my_validation")
    prompts = g.source("prompts")
    answers = g.call("actor.generate", prompts, n=1, do_sample=False, name="answers")
'''

BROKEN = {  # body of validation() after HEAD -> what the one line names
    "renamed_unmarked": ('g.call("reward.score", answers, name="accuracy")',
                         r"validation graph 'my_validation': no node is marked "
                         r"validation='greedy'"),
    "unknown_mark": ('g.call("reward.score", answers, name="accuracy", validation="score")\n'
                     '    g.call("reward.score", answers, name="acc2", validation="greedy")',
                     r"node 'accuracy' \(g.py:\d+\): validation='score' is not one of "
                     r"\['greedy', 'sampled'\]"),
    "two_greedy": ('g.call("reward.score", answers, name="a", validation="greedy")\n'
                   '    g.call("reward.score", answers, name="b", validation="greedy")',
                   r"nodes \['a', 'b'\] are all marked validation='greedy'; mark one"),
    "no_scores": ('g.call("reward.score", answers, name="s")\n'
                  '    g.fn(length, answers, name="len", validation="greedy")',
                  r"node 'len' \(g.py:\d+\): marked validation='greedy', but its output has "
                  r"no 'scores' \(it writes \['length'\]\)"),
    "renamed_scores": ('g.call("reward.score", answers, name="s", rename={"scores": "acc"},'
                       ' validation="greedy")',
                       r"node 's' \(g.py:\d+\): marked validation='greedy', but its output "
                       r"has no 'scores'"),
    "no_row_keys": ('g.call("reward.score", answers, name="s")\n'
                    '    g.fn(ones, g.source("bare", keys=("input_ids",)), name="s2", '
                    'validation="greedy")',
                    r"node 's2' \(g.py:\d+\): marked validation='greedy', but "
                    r"\['data_source', 'uid'\] do not reach it"),
    "sampled_twice": ('g.call("reward.score", answers, name="a", validation="greedy")\n'
                      '    g.call("reward.score", answers, name="b", validation="sampled")\n'
                      '    g.call("reward.score", answers, name="c", validation="sampled")',
                      r"nodes \['b', 'c'\] are all marked validation='sampled'"),
    "not_a_graph": ('return 3', r"validation\(cfg\) in '.*g.py' returned int, not a "
                                r"hybridflow Graph"),
}


def _graph_file(tmp_path, body: str) -> str:
    path = tmp_path / "g.py"
    path.write_text(textwrap.dedent(HEAD) + "    " + body + "\n    return g\n")
    return str(path)


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_check_refuses_every_broken_validation_contract(tmp_path, capsys, case):
    body, pattern = BROKEN[case]
    code = main(["check", _graph_file(tmp_path, body)])
    err = capsys.readouterr().err
    assert code == 1, err
    assert re.search(pattern, err), err


def test_check_does_not_look_at_validation_when_it_is_off(tmp_path):
    body, _ = BROKEN["renamed_unmarked"]
    assert main(["check", _graph_file(tmp_path, body), "trainer.val_every=0"]) == 0


def test_the_trainer_refuses_before_any_worker_starts(tmp_path):
    body, _ = BROKEN["renamed_unmarked"]
    loaded = prepare(_graph_file(tmp_path, body), [f"trainer.runs_dir={tmp_path}"])
    from hybridflow.plan.compiler import GraphError
    with pytest.raises(GraphError, match="no node is marked validation='greedy'"):
        Trainer(loaded, new_run_dir(str(tmp_path), "x"))


OLD_NAMES = ('g.call("reward.score", answers, name="greedy_score")\n'
             '    many = g.call("actor.generate", prompts, n=2, name="sampled")\n'
             '    g.call("reward.score", many, name="sampled_score")')


def test_nodes_found_by_their_old_names_still_validate_for_a_release_with_a_warning(
        tmp_path):
    """Before issue 26 the docs taught a validation graph whose nodes the loop found by
    name; the marks replaced that, and such a graph keeps working for one release,
    warned with the line to add (issue 36)."""
    from hybridflow.program.validation import NamedValidationWarning
    loaded = prepare(_graph_file(tmp_path, OLD_NAMES), [])
    with pytest.warns(NamedValidationWarning) as said:
        plan = compile_validation(loaded.module, loaded.cfg, compile_program)
    assert plan.greedy.node == "greedy_score" and plan.sampled.node == "sampled_score"
    text = [str(w.message) for w in said]
    assert re.search(r"node 'greedy_score' \(g.py:\d+\).*add validation='greedy'", text[0])
    assert "add validation='sampled'" in text[1] and "next release refuses" in text[1]
    assert issubclass(NamedValidationWarning, DeprecationWarning)


def test_check_accepts_the_old_names_with_the_warning(tmp_path):
    from hybridflow.program.validation import NamedValidationWarning
    with pytest.warns(NamedValidationWarning, match="add validation='greedy'"):
        assert main(["check", _graph_file(tmp_path, OLD_NAMES)]) == 0


def test_a_graph_that_marks_one_node_is_not_read_by_old_names(tmp_path, capsys):
    body = ('g.call("reward.score", answers, name="greedy_score")\n'
            '    many = g.call("actor.generate", prompts, n=2, name="sampled")\n'
            '    g.call("reward.score", many, name="spread", validation="sampled")')
    assert main(["check", _graph_file(tmp_path, body)]) == 1
    assert "no node is marked validation='greedy'" in capsys.readouterr().err


def test_the_default_and_the_agent_validation_graphs_are_marked():
    from omegaconf import OmegaConf
    cfg = OmegaConf.create({"trainer": {"val_samples": 4}})
    marks = {n.name: n.validation for n in default_validation_graph(cfg).nodes.values()
             if n.validation}
    assert marks == {"greedy_score": "greedy", "sampled_score": "sampled"}
    loaded = prepare(os.path.join("graphs", "agent_grpo.py"), [])
    plan = compile_validation(loaded.module, loaded.cfg, compile_program)
    assert plan.greedy.node == "greedy_score" and plan.sampled is None


@pytest.mark.slow  # two training steps with validation (~10 s)
def test_renamed_and_marked_nodes_validate_and_their_metrics_are_logged(tmp_path):
    body = ('s = g.call("reward.score", answers, name="accuracy")\n'
            '    g.fn(same, answers, s, name="held_out", validation="greedy")\n'
            '    many = g.call("actor.generate", prompts, n=2, name="many")\n'
            '    g.call("reward.score", many, name="spread", validation="sampled")\n'
            '    g.call("actor.logprob", answers, with_entropy=True)')
    path = _graph_file(tmp_path, body)
    assert main(["check", path]) == 0
    loaded = prepare(path, [f"trainer.runs_dir={tmp_path}", "trainer.progress=false",
                            "trainer.steps=1", "trainer.val_every=1", "trainer.val_samples=2",
                            "data.batch_size=4", "rollout.n=2", "actor.mini_batch_size=8"])
    run = new_run_dir(str(tmp_path), loaded.graph.name)
    trainer = Trainer(loaded, run)
    try:
        trainer.fit()
    finally:
        trainer.close()
    first = run.read_metrics()[0]
    assert 0.0 <= first["val/toy_arith/greedy"] <= 1.0
    assert "val/toy_arith/mean@2" in first and "val/toy_arith/best@2" in first
    assert "val/actor/entropy" in first  # a validation node's own metric is kept
