"""Loading a user's graph file (hybridflow/core/user_code.py): files it imports from its
own folder are found (and marked to travel to Ray workers by value) without putting
the folder on sys.path, so a file there never shadows a standard module."""
from __future__ import annotations

import sys
import textwrap

from hybridflow.program.user_files import load_graph_module
from hybridflow.core.user_code import _BY_VALUE


def _write(path, text):
    path.write_text(textwrap.dedent(text))
    return str(path)


def test_a_helper_beside_the_graph_is_imported_and_shipped_by_value(tmp_path):
    _write(tmp_path / "shaping_helper.py", "BONUS = 0.5\n")
    graph = _write(tmp_path / "shaped.py", """
        import shaping_helper
        from graphs.grpo import build, defaults
        BONUS = shaping_helper.BONUS
    """)
    before = list(sys.path)
    module = load_graph_module(graph)
    assert module.BONUS == 0.5
    assert sys.path == before
    assert "shaping_helper" in _BY_VALUE and module.__name__ in _BY_VALUE


def test_a_file_beside_the_graph_never_shadows_a_standard_module(tmp_path):
    marker = tmp_path / "shadowed"
    _write(tmp_path / "fractions.py", f"open({str(marker)!r}, 'w').close()\n")
    graph = _write(tmp_path / "uses_fractions.py", """
        import fractions
        from graphs.grpo import build, defaults
        HALF = fractions.Fraction(1, 2)
    """)
    sys.modules.pop("fractions", None)
    module = load_graph_module(graph)
    assert module.HALF == 0.5 and not marker.exists()
