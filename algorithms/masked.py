"""Masked reductions over [B, T] tensors, shared by advantages, losses and KL: one
implementation, in `hybridflow.core.tokens` (the engine's metrics use the same), named here
for the math in `algorithms/`."""
from hybridflow.core.tokens import masked_mean, masked_sum, masked_var

__all__ = ["masked_sum", "masked_mean", "masked_var"]
