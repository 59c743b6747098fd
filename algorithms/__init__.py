"""The mathematics of RL post-training as plain torch functions.

Public as `hybridflow.algorithms` (`from hybridflow.algorithms import losses`); an
install puts this folder there. Nothing here imports the engine beyond its per-token
reductions (`hybridflow.core.tokens`): graphs in `hybridflow.graphs` compose these
functions, and tests check them in isolation. Conventions used
throughout: `B` sequences, `T` response tokens, `mask` is the response mask of
shape [B, T] (1 = a real response token, 0 = padding or a skipped token).
"""
if __name__ == "algorithms":  # the old name, imported before hybridflow: the public package
    from hybridflow.core.shipped import adopt
    adopt(__name__)
