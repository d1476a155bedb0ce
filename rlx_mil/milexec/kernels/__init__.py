"""Importing this package registers every milexec kernel in `rlx_mil.milexec.registry.KERNELS`."""

from rlx_mil.milexec.kernels import control, conv, elementwise, linalg, quant, reduce_norm, tensor

__all__ = ["control", "conv", "elementwise", "linalg", "quant", "reduce_norm", "tensor"]
