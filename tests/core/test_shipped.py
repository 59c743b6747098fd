"""Issue 36, item 9: what a user file imports from the shipped library is public and
lives under hybridflow's name (`hybridflow.graphs`, `hybridflow.algorithms`), one module
object per file whichever name imported it; the old top-level names keep working (with
a MovedImportWarning where they are not the repository's own folders), and a user's own
`graphs/` package is never shadowed by them (hybridflow/core/shipped.py, setup.py).

Each case runs in a fresh interpreter: the order of first imports is the point."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _python(code: str, cwd: str, env: dict | None = None, python: str = sys.executable):
    done = subprocess.run([python, "-W", "always::DeprecationWarning", "-c",
                           textwrap.dedent(code)], cwd=cwd, capture_output=True, text=True,
                          env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


@pytest.mark.parametrize("first", ["graphs.ops", "hybridflow.graphs.ops",
                                   "algorithms.losses", "hybridflow.algorithms.losses"])
def test_both_names_are_one_module_object_whichever_imports_first(first):
    done = _python(f"""
        import importlib, sys
        importlib.import_module({first!r})
        import graphs.ops, hybridflow.graphs.ops, graphs.common, hybridflow.graphs.common
        import algorithms.losses, hybridflow.algorithms.losses, algorithms.kl
        from hybridflow.algorithms import kl
        assert graphs.ops is hybridflow.graphs.ops and kl is algorithms.kl
        assert graphs.common.embedded_defaults is hybridflow.graphs.common.embedded_defaults
        assert algorithms.losses.ppo_policy_loss is hybridflow.algorithms.losses.ppo_policy_loss
        import graphs, algorithms, hybridflow
        assert graphs is hybridflow.graphs and algorithms is hybridflow.algorithms
        # every shipped module under the public name, each file loaded once
        shipped = {{n: m for n, m in sys.modules.items()
                    if n.split(".")[0] in ("graphs", "algorithms")
                    or n.startswith(("hybridflow.graphs", "hybridflow.algorithms"))}}
        assert all(m.__name__.startswith("hybridflow.") for m in shipped.values()), shipped
        files = [m.__file__ for m in {{id(m): m for m in shipped.values()}}.values()]
        assert len(files) == len(set(files)), files
        assert hybridflow.graphs.__file__ == {os.path.join(REPO, "graphs", "__init__.py")!r}
        """, cwd=REPO, env={**os.environ, "PYTHONPATH": REPO})
    assert "MovedImportWarning" not in done.stderr  # the checkout's own folders


def test_the_engine_defaults_name_the_public_modules_and_resolve():
    from hybridflow.core.data import DEFAULT_TOY_MAKER, WORD_ARITH_MAKER
    from hybridflow.graph.loss import DEFAULT_LOSS_PROVIDERS
    from hybridflow.program.user_files import import_object
    from hybridflow.workers.scoring import DEFAULT_SCORER_TABLE
    named = [DEFAULT_TOY_MAKER, WORD_ARITH_MAKER, DEFAULT_SCORER_TABLE,
             *(f"{m}:policy_loss" for m in DEFAULT_LOSS_PROVIDERS)]
    assert all(n.startswith(("hybridflow.graphs.", "hybridflow.algorithms.")) for n in named)
    for name in named:
        assert import_object(name, "a default") is not None


def test_a_module_of_the_library_under_an_old_name_is_the_project_s_not_the_user_s():
    """The user's files beside the graph are shipped to workers by value; the library's
    (under any name) is importable there by name."""
    import graphs.ops

    from hybridflow.core.shipped import is_shipped
    from hybridflow.core.user_code import modules_beside
    assert is_shipped(graphs.ops)
    assert modules_beside(REPO, {"graphs.ops", "hybridflow.graphs.ops"}) == []


def _install(tmp_path) -> tuple[str, str]:
    """A fresh venv with hybridflow installed from this checkout (not editable), the
    dependencies from the project's own venv (a plain path: its editable finder of
    the checkout is not run). Returns (python, site-packages)."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_path("
                           "'purelib'))"], capture_output=True, text=True,
                          check=True).stdout.strip()
    deps = [p for p in sys.path if p.endswith("site-packages") and os.path.isdir(p)]
    with open(os.path.join(site, "deps.pth"), "w") as handle:
        handle.write("\n".join(deps) + "\n")
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-build-isolation",
                    "--no-compile", "--quiet", "--target", site, REPO], check=True,
                   capture_output=True, timeout=600)
    return python, site


@pytest.mark.slow
def test_an_install_has_the_public_names_and_a_user_s_own_graphs_package_wins(tmp_path):
    python, site = _install(tmp_path)
    assert os.path.isfile(os.path.join(site, "hybridflow", "graphs", "ops.py"))
    assert os.path.isfile(os.path.join(site, "hybridflow", "algorithms", "rewards",
                                       "__init__.py"))
    assert os.path.isfile(os.path.join(site, "hybridflow", "graphs", "configs",
                                       "smollm2_arith.yaml"))
    assert os.path.isdir(os.path.join(site, "hybridflow", "graphs", "assets", "toy_base"))
    assert not os.path.exists(os.path.join(site, "graphs"))  # nothing generic on top
    assert not os.path.exists(os.path.join(site, "algorithms"))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}

    # the old names: the installed modules themselves, with a warning naming the new
    done = _python("""
        import hybridflow.graphs.ops as public
        import graphs.ops
        from algorithms.losses import ppo_policy_loss
        import hybridflow.algorithms.losses as losses
        assert graphs.ops is public and ppo_policy_loss is losses.ppo_policy_loss
        assert public.__file__.startswith(%r)
        """ % site, cwd=str(elsewhere), env=env, python=python)
    assert "MovedImportWarning: graphs.ops is hybridflow.graphs.ops now" in done.stderr
    assert "import hybridflow.algorithms.losses instead" in done.stderr

    # a user's project with its own graphs/ package beside the graph file
    project = tmp_path / "project"
    (project / "graphs").mkdir(parents=True)
    (project / "graphs" / "__init__.py").write_text("")
    (project / "graphs" / "mine.py").write_text("BONUS = 0.25\n")
    (project / "train.py").write_text(textwrap.dedent("""
        from graphs.mine import BONUS
        from hybridflow.graphs import ops
        from hybridflow.graphs.grpo import ALGORITHM, build, defaults  # noqa: F401
        assert BONUS == 0.25 and callable(ops.policy_loss)
        """))
    done = _python(f"""
        import sys
        from hybridflow.cli import main
        sys.exit(main(["check", {str(project / "train.py")!r}]))
        """, cwd=str(elsewhere), env=env, python=python)
    assert "ok" in done.stdout
    assert "MovedImportWarning" not in done.stderr, done.stderr

    # a graph file written to the old docs (tutorial.md before this release) still checks
    old = tmp_path / "old" / "mine.py"
    old.parent.mkdir()
    old.write_text("from graphs import ops\nfrom graphs.common import embedded_defaults\n"
                   "from graphs.grpo import ALGORITHM, build, defaults  # noqa: F401\n")
    done = _python(f"""
        import sys
        from hybridflow.cli import main
        sys.exit(main(["check", {str(old)!r}]))
        """, cwd=str(elsewhere), env=env, python=python)
    assert "ok" in done.stdout
    assert "graphs.common is hybridflow.graphs.common now" in done.stderr, done.stderr
