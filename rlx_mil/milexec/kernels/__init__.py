"""Importing this package registers every milexec kernel in `rlx_mil.milexec.registry.KERNELS`.

Kernel modules are named by the IR op families whose lowerings emit the MIL ops they run
(`control` holds the state and control-flow ops).
"""

from rlx_mil.milexec.kernels import (
    attention,
    control,
    conv,
    elementwise,
    linalg,
    norm,
    quant,
    reduce,
    rng,
    shape,
)

__all__ = ["attention", "control", "conv", "elementwise", "linalg", "norm", "quant", "reduce", "rng", "shape"]
