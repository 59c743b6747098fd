"""Environments for agent rollouts (user-level code: each is what a user would write
in their own file; see docs/agents.md). `calculator`: the toy agent task."""
