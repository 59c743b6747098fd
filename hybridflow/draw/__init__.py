"""Pictures: a compiled plan as a graphviz drawing, a run's timeline as SVG, and the style
they share.

May import `core/` and `plan/`.
"""
