"""Deployment forms: the same model as a program shaped for the device it runs on
(docs/deploying.md).

* `plain`: rlx_mil's own program (`[B, S, C]` activations, `linear` / `matmul`), unchanged.
* `gpu`: Apple's GPU recipe: `[B, S, C]` with `linear`, fused `scaled_dot_product_attention`
  for every attention that can fuse (iOS18), states as in the plain form.
* `ane`: the Neural Engine recipe: channels-first `[B, C, 1, S]` activations with every
  const-weight projection a 1x1 `conv`, decomposed attention with heads batched in rank-4
  tensors (nothing of rank > 4), fp16-safe masks and norms.

A form is a lowering choice (`lowering_attention`) plus an ordered list of rewrites of the
lowered MIL program (`REWRITES`), run before Core ML's pass pipeline. Each rewrite takes the
program and a `RewriteContext` and changes the program in place.
"""

from __future__ import annotations

from typing import Any

from rlx_mil.coreml.deploy.channels_first import channels_first
from rlx_mil.coreml.deploy.forms import (
    DEPLOY_FORMS,
    DeployForm,
    ProgramRewrite,
    RewriteContext,
    lowering_attention,
)
from rlx_mil.coreml.deploy.rank4 import rank_at_most_4


def _rewrites() -> dict[DeployForm, tuple[ProgramRewrite, ...]]:
    from rlx_mil.coreml.deploy.notch import notch_rewrite
    from rlx_mil.coreml.deploy.wide_split import split_wide

    # The layout rewrites first; the size rules run last: they cut whatever projections the
    # layout rewrites leave (convs), wide ones first (its pieces are then checked for the notch too).
    return {
        DeployForm.PLAIN: (), DeployForm.GPU: (),
        DeployForm.ANE: (channels_first, rank_at_most_4, split_wide, notch_rewrite),
    }


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
