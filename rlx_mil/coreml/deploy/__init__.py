"""Deployment forms: the same model as a program shaped for the device it runs on
(docs/deploying.md).

* `plain`: rlx_mil's own program (`[B, S, C]` activations, `linear` / `matmul`), unchanged.
* `gpu`: Apple's GPU recipe: `[B, S, C]` with `linear`, fused `scaled_dot_product_attention`
  for every attention that can fuse (iOS18), states as in the plain form.
* `ane`: the Neural Engine recipe: channels-first `[B, C, 1, S]` activations with every
  const-weight projection a 1x1 `conv`, attention in the ml-ane-transformers form (nothing of
  rank > 4), fp16-safe masks and norms.

A form is a lowering choice (`lowering_attention`) plus an ordered list of rewrites of the
lowered MIL program (`REWRITES`), run before Core ML's pass pipeline. Each rewrite takes the
program and a `RewriteContext` and changes the program in place.
"""

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
                f"deploy='gpu' is the iOS18 recipe (fused scaled_dot_product_attention, states); target is {target.label}"
            )
        if attention == "decomposed":
            raise InvalidOptionError("deploy='gpu' fuses attention; attention='decomposed' contradicts it")
    if form is DeployForm.ANE:
        if attention == "fused":
            raise InvalidOptionError(
                "deploy='ane' computes attention per head in the ml-ane-transformers form; attention='fused' contradicts it"
            )
        return "decomposed"
    return attention


def _rewrites() -> dict[DeployForm, tuple[ProgramRewrite, ...]]:
    from rlx_mil.coreml.deploy.notch import notch_rewrite
    from rlx_mil.coreml.deploy.wide_split import split_wide

    # The size rules run last: they cut whatever projections the layout rewrites leave, wide
    # ones first (its pieces are then checked for the notch too).
    return {DeployForm.PLAIN: (), DeployForm.GPU: (), DeployForm.ANE: (split_wide, notch_rewrite)}


#: The program rewrites of each form, in the order they run.
REWRITES: dict[DeployForm, tuple[ProgramRewrite, ...]] = _rewrites()


def rewrite_program(program: Any, context: RewriteContext) -> None:
    """Run `context.form`'s rewrites on `program` (nothing for the plain form)."""
    for rewrite in REWRITES[context.form]:
        rewrite(program, context)


__all__ = [
    "DEPLOY_FORMS", "REWRITES", "DeployForm", "ProgramRewrite", "RewriteContext", "lowering_attention",
    "rewrite_program",
]
