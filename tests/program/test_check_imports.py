"""Class: `check` catches what `run` would hit (issue 32, class 7).

Every registered rollout engine, every training backend and the scorers have what
they import checked in the pre-flight that `check` and `run` share
(`program/preflight.check_imports`), before any worker starts: each name of each
registry, with its import made to fail, is one line from `hybridflow check` naming
the key, the value and the module.
"""
from __future__ import annotations

import pytest

import hybridflow.program.preflight as preflight
from hybridflow.cli import main
from hybridflow.workers.backends import BACKENDS
from hybridflow.workers.rollout.engine import _ENGINES, engine_names
from tests.support.e2e import graph_file


def _needs(kind: str, name: str, registry: dict) -> tuple:
    """What the engine's factory or the backend's class declares it imports (`kind`
    names the key in the messages)."""
    return tuple(getattr(registry.get(name), "requires", ()))


def _failing(monkeypatch, module: str) -> None:
    real = preflight.find_spec
    monkeypatch.setattr(preflight, "find_spec",
                        lambda name: None if name == module else real(name))


def _check(capsys, *overrides) -> tuple[int, str]:
    code = main(["check", graph_file("ppo"), *overrides])
    return code, capsys.readouterr().err


def test_every_engine_and_backend_declares_what_it_imports():
    assert all(_needs("rollout.backend", e, _ENGINES) for e in engine_names())
    assert all(_needs("strategy", b, BACKENDS) for b in BACKENDS)


CASES = [("rollout.backend", e, m) for e in engine_names()
         for m in _needs("rollout.backend", e, _ENGINES)] + \
    [(f"{role}.strategy", b, m) for role in ("actor", "critic") for b in BACKENDS
     for m in _needs("strategy", b, BACKENDS)]


@pytest.mark.parametrize("key,name,module", CASES)
def test_a_name_whose_import_fails_is_refused_by_check(capsys, monkeypatch, key, name,
                                                       module):
    _failing(monkeypatch, module)
    others = [f"actor.strategy={b}" for b in BACKENDS if b != name][:1] \
        if key == "critic.strategy" else []  # the actor's backend is checked first
    code, err = _check(capsys, f"{key}={name}", *others)
    assert code == 1, err
    assert err.startswith(f"hybridflow check: {key}={name!r} needs the Python module "
                          f"{module!r}, which does not import here (No module named "
                          f"{module!r}); install it"), err


def test_the_issue_case_vllm_not_installed_is_refused(capsys):
    if preflight._missing("vllm") is None:
        pytest.skip("vLLM is installed here")
    code, err = _check(capsys, "rollout.backend=vllm")
    assert code == 1 and "rollout.backend='vllm' needs the Python module 'vllm'" in err


def test_a_scorer_table_or_scorer_file_that_does_not_import_is_refused(capsys, tmp_path):
    code, err = _check(capsys, "reward.scorer_table=no_such_package.rewards:TABLE")
    assert code == 1 and "reward.scorer_table" in err and "no_such_package" in err, err
    scorer = tmp_path / "needs.py"
    scorer.write_text("import no_such_scoring_lib\n\n"
                      "def compute_score(data_source, solution_str, ground_truth, "
                      "extra_info=None):\n    return 0.0\n")
    for key in (f"reward.function_path={scorer}",
                f"reward.scorers.extra.function_path={scorer}"):
        code, err = _check(capsys, key)
        assert code == 1, (key, err)
        assert "no_such_scoring_lib" in err and str(scorer) in err, (key, err)
