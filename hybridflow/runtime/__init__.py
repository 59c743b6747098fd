"""Executing a compiled plan: the one scheduler, the executor protocol it drives, the
local executor, the worker shell that hosts a pool's roles (in-process or as a Ray actor),
resharding between pools; `ray/` holds the Ray executor's pieces.

May import `core/`, `graph/` and `plan/`; workers are built from the classes the program
hands over, never imported by name.
"""
