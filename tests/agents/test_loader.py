"""Environments named in config load, or fail with the spec and what to fix."""
import textwrap

import pytest

from hybridflow.agents import EnvironmentSpecError, check_environment


def write(tmp_path, source: str) -> str:
    path = tmp_path / "my_env.py"
    path.write_text(textwrap.dedent(source))
    return str(path)


GOOD = """
    class Env:
        def reset(self, row):
            return row["prompt"]

        def step(self, turn):
            return ("ok", 0.0, True)

    def make():
        return Env()

    NOT_CALLABLE = 3

    class NoStep:
        def reset(self, row):
            return "x"
"""


def test_a_class_or_a_factory_in_a_file_loads_and_builds(tmp_path):
    path = write(tmp_path, GOOD)
    assert check_environment(f"{path}:Env")().reset({"prompt": "p"}) == "p"
    assert check_environment(f"{path}:make")().step(None) == ("ok", 0.0, True)


@pytest.mark.parametrize("name,message", [
    ("Missing", "defines no 'Missing'; it defines Env, NoStep, make"),
    ("NOT_CALLABLE", "is a int, not a class"),
    ("NoStep", "built a NoStep without step")])
def test_a_wrong_name_or_shape_is_reported(tmp_path, name, message):
    with pytest.raises(EnvironmentSpecError, match=message):
        check_environment(f"{write(tmp_path, GOOD)}:{name}")


def test_missing_files_failing_imports_and_bad_specs_are_reported(tmp_path):
    with pytest.raises(EnvironmentSpecError, match="does not exist"):
        check_environment(f"{tmp_path}/nope.py:Env")
    bad = tmp_path / "bad_env.py"
    bad.write_text("import not_a_module_anywhere\n")
    with pytest.raises(EnvironmentSpecError, match="failed to import: ModuleNotFoundError"):
        check_environment(f"{bad}:Env")
    with pytest.raises(EnvironmentSpecError, match="or 'path/to/file.py:NAME'"):
        check_environment("just_a_name")
    with pytest.raises(EnvironmentSpecError, match="cannot import module"):
        check_environment("no.such.module:Env")


def test_a_factory_that_needs_arguments_is_reported():
    with pytest.raises(EnvironmentSpecError, match="building one with no arguments raised "
                                                   "TypeError"):
        check_environment("hybridflow.agents.tools:ToolEnvironment")
