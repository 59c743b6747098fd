"""The compiled plan: its types (`PlanNode`, `ExecutionPlan`, `GraphError`), the compiler's
checks and lowering, placement (pools and colocation), and the passes that rewrite a plan
(weight sync, token balance, async sides).

May import `core/` and `graph/`; worker classes are read through their declarations only.
"""
