"""The Core ML pass pipeline rlx_mil converts with, and the structural form of a program that
shows it gives the same result as Core ML's default pipeline.

Core ML's default pipeline runs ~90 graph passes, each followed by a validation of the whole
program; most look for patterns that frontends for PyTorch or TensorFlow emit (conv + batch-norm,
gelu approximations, padding chains, image preprocessing, quantize/dequantize sandwiches,
transpose chains) and that rlx_mil's rules never produce — a rule emits the fused or final form
itself. `rlx_passes` keeps, in the default order, only the passes that can change a program
rlx_mil emits (`RLX_PASS_NAMES`), and the costly `reduce_transposes` only for programs with a
transpose it could move (programs with quantized ops take the default pipeline, less that pass
where it could move nothing). `tests/lower/test_pipeline.py` checks on every catalogue graph, on
several targets, both precisions and both attention forms that this yields the same program as
the default pipeline (`program_structure`: the same ops computing the same values from the same
inputs, whatever their names or order).
"""

from __future__ import annotations

import hashlib
import logging
import sys
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

from rlx_mil.coreml import patches
from rlx_mil.lowering.target import Precision

#: coremltools 9.0 passes that break programs built in fp16: `fuse_elementwise_to_batchnorm`
#: turns `mul`/`add` by [C, 1, 1] consts on a rank-4 fp16 tensor into a `batch_norm` whose
#: mean/variance it makes fp32, which its own type check then rejects. `add_int16_cast` (iOS17+)
#: casts every int32 input of gather / gather_along_axis / gather_nd / topk to int16 or uint16,
#: data included, picking the signedness from whichever const it saw last: int32 data outside
#: that range (a -1 gathered as uint16 reads 65535) comes out wrong.
FP16_UNSAFE_PASSES = frozenset({"common::fuse_elementwise_to_batchnorm", "common::add_int16_cast"})

#: The default pipeline's passes that can change a program rlx_mil emits (they run in the
#: default order, as often as there): folding and dead code, no-ops, consecutive reshapes,
#: duplicate consts and ops, division by constants, transposes folded into matmuls, the casts
#: of the precision handling, gather-index guards and I/O naming.
RLX_PASS_NAMES = frozenset({
    "common::update_output_dtypes",
    "common::cast_optimization",
    "common::noop_elimination",
    "common::const_elimination",
    "common::sanitize_input_output_names",
    "common::divide_to_multiply",
    "common::const_deduplication",
    "common::merge_consecutive_reshapes",
    "common::fuse_transpose_matmul",
    # element-wise per-channel scale/shift chains (batch norms spelled out) and reductions
    # that Core ML fuses into its own normalisation ops
    "common::fuse_layernorm_or_instancenorm",
    "common::fuse_elementwise_to_batchnorm",
    "common::fuse_reduce_mean",
    # quantized ops (dequantize chains become constexpr weights)
    "common::int_op_canonicalization",
    "common::nullify_redundant_quantization_zero_point",
    "common::dequantize_quantize_pair_elimination",
    "common::distributive_quantized_binary_op_scale_normalization",
    "common::dequantize_to_constexpr",
    "common::canonicalize_quantized_lut_pattern",
    "common::merge_affine_dequantize_with_consecutive_ops",
    "common::expand_dynamic_linear",
    "common::remove_redundant_ops",
    "common::dedup_op_and_var_names",
    "common::add_fp16_cast",
    "common::add_int16_cast",
    "common::guard_negative_gather_indices",
    "common::dead_code_elimination",
    "common::topological_reorder",
})

#: Moves transposes through element-wise ops and cancels them. The costliest pass by far (it
#: rescans the program for every transpose); it runs only for programs where a transpose feeds
#: an op it could move it through.
REDUCE_TRANSPOSES = "common::reduce_transposes"



def _transpose_movers() -> frozenset[str]:
    """Op types `reduce_transposes` moves a transpose through (coremltools' own tables):
    unary-like and axis-updatable ops (element-wise binaries, reductions, concat, split, pad)
    and transposes. Every other consumer takes the permuted tensor as it is."""
    from coremltools.converters.mil.mil.passes.defs.optimize_repeat_ops import _TransposeOptimization

    return frozenset(
        {"transpose", *_TransposeOptimization._UNARY_LIKE_OP_TYPES, *_TransposeOptimization._AXIS_UPDATE_OPS}
    )


def default_pass_pipeline(precision: Precision) -> Any:
    """Core ML's default pipeline, minus the passes that cannot handle fp16 programs."""
    import coremltools as ct

    pipeline = ct.PassPipeline.DEFAULT
    if precision is Precision.FP16:
        pipeline.remove_passes(FP16_UNSAFE_PASSES)
    return pipeline


def needs_reduce_transposes(program: Any) -> bool:
    """Whether some transpose of `program` feeds an op `reduce_transposes` could move it
    through (else the pass cannot change the program)."""
    movers = _transpose_movers()
    for func in program.functions.values():
        for op in func.operations:
            if op.op_type == "transpose" and any(child.op_type in movers for child in op.outputs[0].child_ops):
                return True
    return False


def rlx_passes(program: Any = None) -> list[str]:
    """The default pipeline's passes in `RLX_PASS_NAMES`, in its order (plus
    `reduce_transposes` where `program` needs it, or always when no program is given)."""
    import coremltools as ct

    # Newer op families (quantized matmuls, explicit batch norms) still need passes outside
    # RLX_PASS_NAMES; until each is covered, every default pass runs except reduce_transposes
    # where it cannot change the program.
    skip = set() if program is None or needs_reduce_transposes(program) else {REDUCE_TRANSPOSES}
    return [name for name in ct.PassPipeline.DEFAULT.passes if name not in skip]


#: Op types whose programs take Core ML's whole default pipeline: the quantized-op passes'
#: interplay is not covered by the trimmed list yet.
_DEFAULT_PIPELINE_OPS = ("quantize", "dequantize", "constexpr_")


def rlx_pass_pipeline(precision: Precision, program: Any = None) -> Any:
    """The pipeline `rlx_mil.convert` runs: `rlx_passes(program)` with the default options
    (the default pipeline for programs with quantized ops)."""
    import coremltools as ct

    if program is not None and any(
        op.op_type.startswith(_DEFAULT_PIPELINE_OPS) for f in program.functions.values() for op in f.operations
    ):
        pipeline = default_pass_pipeline(precision)
        if not needs_reduce_transposes(program):
            # As in the trimmed list: it cannot change the program, and it would re-infer every
            # op of it (4 s of a 3-function SmolLM2-135M conversion with compressed weights).
            pipeline.remove_passes([REDUCE_TRANSPOSES])
        return pipeline

    pipeline = ct.PassPipeline.DEFAULT
    pipeline.passes = rlx_passes(program)
    if precision is Precision.FP16:
        pipeline.remove_passes(FP16_UNSAFE_PASSES)
    return pipeline


DEAD_CODE_ELIMINATION = "common::dead_code_elimination"


@contextmanager
def validation_once_per_pipeline() -> Iterator[None]:
    """While active, a pass pipeline validates its program once, after its last pass.

    coremltools validates the whole program before the first pass and after every pass (~95
    walks over every op, var and scope of a 1,600-op program for a 1B-parameter model: about
    half the time of the passes). A pass that left an invalid program is still caught before
    serialisation, by the one validation, with the essential-scope check that a dead-code
    elimination run asks for.
    """
    from coremltools.converters.mil.mil.passes.pass_pipeline import PassPipelineManager

    original = PassPipelineManager.apply_pipeline
    if getattr(original, "rlx_mil_once", False):  # a conversion already installed it
        yield
        return

    def apply_pipeline(prog: Any, pass_pipeline: Any) -> None:
        prog.validate = lambda *args, **kwargs: None  # this program only, for this pipeline
        try:
            original(prog, pass_pipeline)
        finally:
            del prog.validate
        if pass_pipeline is not None:
            prog.validate(check_essential_scope=DEAD_CODE_ELIMINATION in pass_pipeline.passes)

    apply_pipeline.rlx_mil_once = True  # type: ignore[attr-defined]
    with patches.replaced(
        "coremltools.converters.mil.mil.passes.pass_pipeline:PassPipelineManager.apply_pipeline",
        staticmethod(apply_pipeline),
    ):
        yield


@contextmanager
def passless_programs_left_alone() -> Iterator[None]:
    """While active, a pass pipeline returns a program whose passes are all skipped
    (`Program.skip_all_passes`, as `rlx_mil.coreml.multifunction.join_programs` sets on the
    joined program) as it came, without validating or printing it: none of its passes runs,
    so it leaves nothing to check. coremltools validates such a program before and after each
    of its ~100 passes, each skipping, and prints it twice per pipeline."""
    target = "coremltools.converters.mil.mil.passes.pass_pipeline:PassPipelineManager.apply_pipeline"
    original = patches.current(target).__func__

    def apply_pipeline(prog: Any, pass_pipeline: Any) -> None:
        if not getattr(prog, "skip_all_passes", False):
            original(prog, pass_pipeline)

    with patches.replaced(target, staticmethod(apply_pipeline)):
        yield


@contextmanager
def nonreplaceable_marks_only_with_constexprs() -> Iterator[None]:
    """While active, a block skips recomputing its vars' non-replaceable marks when leaving
    its context (as every graph pass and every op building makes it) unless some var made a
    mark since the block began.

    Core ML marks each var with the constexpr vars it depends on (a pass may not replace a var
    by one that loses them). The recomputation resets and unions a set per var of the whole
    block each time: about a quarter of a conversion of a 100-op program. Every mark starts at
    a constexpr op's output (the set of that var alone) and reaches other vars through the
    marks' setter, which notes here whether it ever set a non-empty one: until it has, every
    set the recomputation would make is empty, which is what each var already holds (programs
    are built inside the block, as `rlx_mil.convert` does). Programs with compressed weights
    recompute as before, from their first constexpr op on. (Scanning the program for a
    constexpr op or a mark at each exit instead cost a walk over every op and var, ~100 walks
    per conversion.)
    """
    from coremltools.converters.mil.mil.block import Block
    from coremltools.converters.mil.mil.var import Var

    original = Block.__dict__["_propagate_nonreplaceable_vars"]
    if getattr(original, "rlx_mil_skips", False):  # a conversion already installed it
        yield
        return
    marks = Var.__dict__["nonreplaceable_vars_upstream"]
    marked = [False]

    def set_marks(var: Any, value: set[Any]) -> None:
        if value:
            marked[0] = True
        marks.fset(var, value)

    def propagate_where_needed(self: Any) -> None:
        if marked[0]:
            recompute_marks(self)

    propagate_where_needed.rlx_mil_skips = True  # type: ignore[attr-defined]
    with (
        patches.replaced("coremltools.converters.mil.mil.var:Var.nonreplaceable_vars_upstream",
                         property(marks.fget, set_marks, doc=marks.__doc__)),
        patches.replaced("coremltools.converters.mil.mil.block:Block._propagate_nonreplaceable_vars",
                         propagate_where_needed),
    ):
        yield


def recompute_marks(block: Any) -> None:
    """`Block._propagate_nonreplaceable_vars` of coremltools 9.0 without its per-var method
    calls and property checks (the same sets: reset, then a constexpr output marks itself, a
    `shape` output nothing, any other the union of its op's inputs' marks). On a compressed
    3-function SmolLM2-135M conversion it runs at each of ~300 block exits over ~4,000 ops."""
    from coremltools.converters.mil.mil.var import InternalVar

    for op in block.operations:
        for inner in op.blocks:
            recompute_marks(inner)
        outputs = op.outputs
        if outputs is None:
            continue
        op_type = op.op_type
        if op_type == "shape":
            for out in outputs:
                out._nonreplaceable_vars_upstream = set()
            continue
        if op_type.startswith("constexpr_"):
            for out in outputs:
                out._nonreplaceable_vars_upstream = {out} if out.op is not None else set()
            continue
        marks = []
        for value in op._input_vars.values():  # `Operation.inputs`, without building its dict
            if value is None or isinstance(value, InternalVar):
                continue
            for var in value if isinstance(value, (list, tuple)) else (value,):
                marks.append(var._nonreplaceable_vars_upstream)
        for out in outputs:
            out._nonreplaceable_vars_upstream = set().union(*marks) if out.op is not None else set()


#: The pattern programs coremltools' activation fusions (`fuse_gelu_tanh_approximation`,
#: `fuse_prelu`) build with the MIL builder each time they run.
FUSION_PATTERNS = tuple(
    target for target in patches.PATCHES
    if target.startswith("coremltools.converters.mil.mil.passes.defs.optimize_activation:")
)
_built_patterns: dict[str, Any] = {}


def _built_once(target: str, build: Any) -> Any:
    def pattern() -> Any:
        if target not in _built_patterns:
            _built_patterns[target] = build()
        return _built_patterns[target]

    pattern.rlx_mil_once = True  # type: ignore[attr-defined]
    return pattern


@contextmanager
def fusion_patterns_built_once() -> Iterator[None]:
    """While active, coremltools' gelu and prelu fusion passes match against pattern programs
    built once per process instead of on every run.

    Each of the four patterns is a small MIL program the pattern matcher only reads (coremltools'
    own `register_generic_pass` reuses one program for every run the same way); building them
    anew made up about a third of converting a 10-op program."""
    with ExitStack() as stack:
        for target in FUSION_PATTERNS:
            build = patches.current(target).__func__
            if not getattr(build, "rlx_mil_once", False):  # else a conversion already installed it
                stack.enter_context(patches.replaced(target, staticmethod(_built_once(target, build))))
        yield


_PASS_PIPELINE_MODULE = "coremltools.converters.mil.mil.passes.pass_pipeline"
#: Passes that format their function into a debug message before and after their rewrite:
#: `reduce_transposes` and `fuse_layernorm_or_instancenorm`.
_FUNCTION_PRINTING_MODULES = frozenset({
    "coremltools.converters.mil.mil.passes.defs.optimize_repeat_ops",
    "coremltools.converters.mil.mil.passes.defs.optimize_normalization",
})


@contextmanager
def program_text_only_when_logged() -> Iterator[None]:
    """While active, coremltools' pass pipeline prints its program (and two passes their
    function) for its debug log only when that log is on.

    `PassPipelineManager.apply_pipeline` formats the whole program into a `logger.debug` f-string
    before and after each of the three pipelines of a conversion, whether or not debug logging
    is on: six printouts of the program per conversion (~7% of converting a 10-op program, more
    for large ones); `fuse_layernorm_or_instancenorm` and `reduce_transposes` format the function
    twice more each time they run (about a second for a 28-layer decoder). Any other
    `str(program)` or `str(function)` is unchanged."""
    from coremltools import _logger as coremltools_logger
    from coremltools.converters.mil.mil.block import Function
    from coremltools.converters.mil.mil.program import Program

    original = Program.__dict__["__str__"]
    if getattr(original, "rlx_mil_quiet", False):  # a conversion already installed it
        yield
        return
    original_function = Function.__dict__["__str__"]

    def program_text(self: Any) -> str:
        caller = sys._getframe(1)
        if (
            caller.f_code.co_name == "apply_pipeline" and caller.f_globals.get("__name__") == _PASS_PIPELINE_MODULE
            and not coremltools_logger.isEnabledFor(logging.DEBUG)
        ):
            return "<program>"
        return str(original(self))

    def function_text(self: Any) -> str:
        if (
            sys._getframe(1).f_globals.get("__name__") in _FUNCTION_PRINTING_MODULES
            and not coremltools_logger.isEnabledFor(logging.DEBUG)
        ):
            return "<function>"
        return str(original_function(self))

    program_text.rlx_mil_quiet = True  # type: ignore[attr-defined]
    with (
        patches.replaced("coremltools.converters.mil.mil.program:Program.__str__", program_text),
        patches.replaced("coremltools.converters.mil.mil.block:Function.__str__", function_text),
    ):
        yield


# ---------------------------------------------------------------------------------- structure


def _digest(*parts: object) -> str:
    return hashlib.sha1(repr(parts).encode()).hexdigest()


def _const_digest(value: Any) -> str:
    import numpy as np

    arr = np.asarray(value)
    if arr.dtype.kind in "iu":  # an op parameter given as int32 or int64 means the same
        arr = arr.astype(np.int64)
    data = arr.tobytes() if arr.dtype != object else repr(arr.tolist()).encode()
    return _digest("const", str(arr.dtype), arr.shape, hashlib.sha1(data).hexdigest())


def _positive_axes(axes: Any) -> Any:
    import numpy as np

    arr = np.asarray(axes, dtype=np.int64)
    return np.where(arr < 0, arr + arr.size, arr)


def _live_ops(block: Any) -> set[int]:
    """Ids of the ops of `block` its outputs depend on (dead ops do not change what it computes)."""
    producer = {id(out): op for op in block.operations for out in op.outputs}
    live: set[int] = set()
    stack = [producer[id(v)] for v in block.outputs if id(v) in producer]
    while stack:
        op = stack.pop()
        if id(op) in live:
            continue
        live.add(id(op))
        for value in op.inputs.values():
            for v in value if isinstance(value, (list, tuple)) else [value]:
                if id(v) in producer:
                    stack.append(producer[id(v)])
        for inner in op.blocks:  # vars of this block used inside nested blocks
            for inner_op in inner.operations:
                for value in inner_op.inputs.values():
                    for v in value if isinstance(value, (list, tuple)) else [value]:
                        if id(v) in producer:
                            stack.append(producer[id(v)])
    return live


def _block_structure(block: Any, outer: dict[int, str]) -> tuple[Counter[str], list[str]]:
    known = dict(outer)
    if not isinstance(block.inputs, dict):  # a nested block's inputs (a function's are in `outer`)
        for i, var in enumerate(block.inputs):
            known[id(var)] = _digest("block_input", i, str(var.sym_type))
    live = _live_ops(block)
    ops: Counter[str] = Counter()
    for op in block.operations:
        if op.op_type == "const":
            sig = _const_digest(op.outputs[0].val)
        else:
            args: list[tuple[str, tuple[str, ...]]] = []
            for name, value in sorted(op.inputs.items()):
                values = value if isinstance(value, (list, tuple)) else [value]
                if name == "perm" and op.op_type == "transpose" and value.val is not None:
                    # [0, 2, 1, 3] and [0, 2, -3, -1] are one permutation (passes rewrite them)
                    args.append((name, (_const_digest(_positive_axes(value.val)),)))
                    continue
                args.append((name, tuple(known[id(v)] if id(v) in known else _const_digest(v.val) for v in values)))
            inner = [_block_structure(b, known) for b in op.blocks]
            sig = _digest(op.op_type, tuple(args), tuple((sorted(c.items()), outs) for c, outs in inner))
        if id(op) in live and op.op_type != "const":  # a const counts through its consumers
            ops[sig] += 1
        for i, out in enumerate(op.outputs):
            known[id(out)] = _digest(sig, i, str(out.sym_type))
    return ops, [known[id(v)] for v in block.outputs]


def program_structure(program: Any) -> dict[str, Any]:
    """A program's structure without names or op order: per function, each op identified by
    its type and (recursively) everything it computes from, as a multiset, plus the outputs;
    input names and types are kept (they are the model's interface). Two programs with equal
    structures compute the same values through the same ops."""
    out: dict[str, Any] = {}
    for fname, func in program.functions.items():
        known = {id(var): _digest("input", name, str(var.sym_type)) for name, var in func.inputs.items()}
        ops, outputs = _block_structure(func, known)
        out[fname] = (sorted(ops.items()), outputs, [v.name for v in func.outputs])
    return out
