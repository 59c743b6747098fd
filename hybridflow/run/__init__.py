"""One run from start to end: the step loop, the async schedule, checkpoints, the run
directory and what is written to it, the run's lock, signals and lifecycle.

May import every layer below the CLI (`program/`, `runtime/`, `plan/`, `draw/`, `core/`...);
never `commands/`.
"""
