"""Where the test suite's time goes: wall and CPU seconds per test module.

    python bench/suite_times.py [pytest args...]     # e.g. -m slow, or tests/e2e

runs pytest in this process with a small plugin and prints the modules by wall time,
with the CPU seconds (this process and the processes it waited for: subprocess runs,
Ray's raylet and workers once their session ends) and the load average before and
after. On a shared machine the wall seconds are inflated by other work; the CPU
seconds are not, so they compare a module before and after a change under any load
(a single-threaded module takes about its CPU seconds of wall on an idle machine).
It runs the tests serially in this process, whatever the suite's `-n` (xdist)
says. Writes bench/results/suite_times.json.
"""
from __future__ import annotations

import json
import os
import sys
import time
from collections import defaultdict

import pytest

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "suite_times.json")


def cpu_seconds() -> float:
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


class ModuleTimes:
    """Sums each test's setup+call+teardown (module fixtures included) per module."""

    def __init__(self):
        self.wall, self.cpu = defaultdict(float), defaultdict(float)
        self.tests, self.outcomes = defaultdict(int), defaultdict(int)

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item, nextitem):
        module = item.nodeid.split("::")[0]
        wall, cpu = time.monotonic(), cpu_seconds()
        yield
        self.wall[module] += time.monotonic() - wall
        self.cpu[module] += cpu_seconds() - cpu
        self.tests[module] += 1

    def pytest_runtest_logreport(self, report):
        if report.when == "call" or report.outcome != "passed":
            self.outcomes[report.outcome] += 1


def serial() -> list[str]:
    """`-n 0` where pytest-xdist is installed: the suite's addopts spread it over worker
    processes, whose tests this plugin would not see; it times them in this one."""
    try:
        import xdist  # noqa: F401
    except ImportError:
        return []
    return ["-n", "0"]


def main(args: list[str], out: str = OUT) -> int:
    times = ModuleTimes()
    load_before, start, cpu = os.getloadavg(), time.monotonic(), cpu_seconds()
    code = pytest.main(["-q", "-p", "no:cacheprovider", *serial(), *args], plugins=[times])
    total_wall, total_cpu = time.monotonic() - start, cpu_seconds() - cpu
    load_after = os.getloadavg()
    rows = sorted(times.wall, key=times.wall.get, reverse=True)
    print(f"\n{'module':<52} {'tests':>5} {'wall s':>8} {'cpu s':>8}")
    for module in rows:
        print(f"{module:<52} {times.tests[module]:>5} {times.wall[module]:>8.1f} "
              f"{times.cpu[module]:>8.1f}")
    print(f"{'total (with collection)':<52} {sum(times.tests.values()):>5} "
          f"{total_wall:>8.1f} {total_cpu:>8.1f}")
    print(f"load average before {load_before[0]:.2f}, after {load_after[0]:.2f} "
          f"(1 min), {os.cpu_count()} cores")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w") as handle:
        json.dump({"args": args, "exit": int(code), "wall_s": total_wall, "cpu_s": total_cpu,
                   "load_before": load_before, "load_after": load_after,
                   "cores": os.cpu_count(), "outcomes": dict(times.outcomes),
                   "modules": {m: {"tests": times.tests[m], "wall_s": times.wall[m],
                                   "cpu_s": times.cpu[m]} for m in rows}}, handle, indent=1)
    print(f"wrote {out}")
    return int(code)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
