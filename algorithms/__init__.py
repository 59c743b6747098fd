"""The mathematics of RL post-training as plain torch functions.

Nothing here imports the engine (`hybridflow`): graphs in `graphs/` compose
these functions, and tests check them in isolation. Conventions used
throughout: `B` sequences, `T` response tokens, `mask` is the response mask of
shape [B, T] (1 = a real response token, 0 = padding or a skipped token).
"""
