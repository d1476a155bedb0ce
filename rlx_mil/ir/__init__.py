"""The RLX IR as typed Python data."""

from rlx_mil.ir.dtype import DType
from rlx_mil.ir.graph import Graph, Node, NodeOrigin
from rlx_mil.ir.ops import *  # noqa: F403
from rlx_mil.ir.ops import OP_TYPES, MaskKind, MaskType, Op, QuantKind, QuantScheme
from rlx_mil.ir.shape import Dim, Dynamic, Shape, Static

__all__ = [
    "OP_TYPES",
    "DType",
    "Dim",
    "Dynamic",
    "Graph",
    "MaskKind",
    "MaskType",
    "Node",
    "NodeOrigin",
    "Op",
    "QuantKind",
    "QuantScheme",
    "Shape",
    "Static",
]
