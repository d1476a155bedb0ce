"""The deployment forms and what a program rewrite knows of the conversion (re-exported by
`rlx_mil.coreml.deploy`)."""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rlx_mil.coreml.output_pieces import OutputPieces
from rlx_mil.errors import InvalidOptionError
from rlx_mil.lowering.target import Precision, Target


class DeployForm(enum.Enum):
    """The device a package is shaped for."""

    PLAIN = "plain"
    GPU = "gpu"
    ANE = "ane"

    @classmethod
    def parse(cls, value: str | DeployForm) -> DeployForm:
        """`value` ("plain", "gpu", "ane" or a `DeployForm`) as a form; anything else is an
        `InvalidOptionError` naming the `deploy` option."""
        if isinstance(value, DeployForm):
            return value
        if isinstance(value, str):
            for form in cls:
                if value.strip().lower() == form.value:
                    return form
        raise InvalidOptionError(f"deploy must be one of {', '.join(repr(f.value) for f in cls)}, got {value!r}")


#: What `deploy=` accepts, in the order the docs and the CLI list them.
DEPLOY_FORMS = tuple(form.value for form in DeployForm)


@dataclass(frozen=True)
class RewriteContext:
    """What a program rewrite knows of the conversion."""

    form: DeployForm
    target: Target
    precision: Precision
    #: The Neural Engine form returns an output wider than 16,384 (the LM head) as pieces;
    #: False concatenates them into the one output (`split_logits=False`).
    split_outputs: bool = True
    #: Filled by the rewrites: each output (interface name) now returned as pieces.
    split_outputs_made: dict[str, OutputPieces] = field(default_factory=dict, compare=False)


#: A rewrite of a lowered MIL program (coremltools `Program`), in place.
ProgramRewrite = Callable[[Any, RewriteContext], None]


def lowering_attention(form: DeployForm, attention: str, target: Target) -> str:
    """The `attention=` lowering mode for `form` (the caller's `attention` otherwise). The
    GPU form needs the fused attention, which exists from iOS18 on; the Neural Engine form
    rewrites the decomposed one. An attention mode contradicting the form is refused."""
    if form is DeployForm.GPU:
        if target < Target.IOS18:
            raise InvalidOptionError(
                f"deploy='gpu' (--deploy gpu) is the iOS18 recipe (fused scaled_dot_product_attention, states);"
                f" target is {target.label} (--target): use iOS18 or later, or another deploy form"
            )
        if attention == "decomposed":
            raise InvalidOptionError("deploy='gpu' (--deploy gpu) fuses attention; attention='decomposed' (--attention)"
                                     " contradicts it")
    if form is DeployForm.ANE:
        if attention == "fused":
            raise InvalidOptionError(
                "deploy='ane' (--deploy ane) decomposes attention (one softmax per head, rank-4 tensors);"
                " attention='fused' (--attention) contradicts it"
            )
        return "decomposed"
    return attention
