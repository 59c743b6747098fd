"""The package layout, which pyproject.toml cannot compute: the repository keeps the
shipped library as top-level folders (graphs/, algorithms/), and an install puts them
under hybridflow's own name (`hybridflow.graphs`, `hybridflow.algorithms`), so a user's
own `graphs/` folder never collides with an installed one (hybridflow/core/shipped.py
keeps one module object per file in a checkout, where both names exist).
Everything else is in pyproject.toml."""
from setuptools import find_packages, setup

SHIPPED = ("graphs", "algorithms")

packages = find_packages(include=["hybridflow", "hybridflow.*"])
package_dir = {}
for top in SHIPPED:
    package_dir[f"hybridflow.{top}"] = top
    packages += [f"hybridflow.{name}" for name in find_packages(include=[top, f"{top}.*"])]

setup(packages=packages, package_dir=package_dir,
      package_data={"hybridflow.graphs": ["assets/**/*", "configs/*.yaml"]})
