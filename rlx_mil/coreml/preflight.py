"""`rlx_mil.preflight`: a static check of a Core ML ML Program against the published rules of
the Neural Engine and the GPU (`preflight_rules.RULES`; docs/deploying.md).

It reads the package's protobuf spec (`MLModel(..., skip_model_load=True).get_spec()`) and walks
every function's MIL block, so it checks any `.mlpackage`, whoever built it. Nothing is compiled
or run: what only a device shows (op placement, timings) is outside it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from rlx_mil.coreml.package_info import open_model
from rlx_mil.coreml.preflight_rules import (
    ANE_GATHER_OPS,
    ANE_MAX_DIM,
    ANE_UNSUPPORTED_OPS,
    ANY_MAX_DIM,
    DATA_MOVEMENT_OPS,
    DEVICES,
    IOS_MAX_WEIGHT_FILE,
    MACOS_MAX_WEIGHT_FILE,
    MIB,
    RULES,
    Device,
    Severity,
    core_payload,
    on_notch,
)
from rlx_mil.errors import InvalidOptionError, RlxMilError
from rlx_mil.units import counted

# MIL protobuf data types (coremltools.proto.MIL_pb2.DataType).
_FP16, _FP32, _UINT4 = 10, 11, 35
_DTYPE_BYTES = {1: 1, 10: 2, 11: 4, 13: 2, 21: 1, 23: 4, 31: 1}
_DTYPE_NAMES = {1: "bool", 10: "fp16", 11: "fp32", 13: "bf16", 21: "int8", 23: "int32", 25: "int4", 31: "uint8",
                35: "uint4", 36: "uint2", 37: "uint1", 38: "uint6", 39: "uint3"}
_CT_VERSION = "com.github.apple.coremltools.version"
_RLX_MIL_VERSION = "rlx_mil.version"


@dataclass(frozen=True)
class Finding:
    """One rule a package breaks (or, with severity "note", an exemption it gets)."""

    rule: str
    severity: Severity
    #: The MIL function, the op (`type name`) and the var concerned; "" where the finding is
    #: about the whole package (a weight file) or function.
    function: str
    op: str
    var: str
    why: str
    source: str
    fix: str

    def to_text(self) -> str:
        where = " ".join(p for p in (self.function and f"{self.function}:", self.op, self.var and f"-> {self.var}") if p)
        return f"{self.severity}: [{self.rule}] {where + ': ' if where else ''}{self.why}\n" \
               f"    source: {self.source}\n    fix: {self.fix}"

    def to_dict(self) -> dict[str, str]:
        return {k: str(v) for k, v in asdict(self).items()}


def is_finding(finding: Finding) -> bool:
    """True for what counts against a package (errors and warnings); notes say why something was
    not flagged."""
    return finding.severity != "note"


def findings_json(findings: list[Finding]) -> str:
    return json.dumps([f.to_dict() for f in findings], indent=2)


@dataclass(frozen=True)
class _Tensor:
    dtype: int
    dims: tuple[int | None, ...]  # None: a flexible (unknown) dim


def _tensor(value_type: Any) -> _Tensor | None:
    if value_type.HasField("stateType"):
        value_type = value_type.stateType.wrappedType
    if not value_type.HasField("tensorType"):
        return None
    t = value_type.tensorType
    dims = tuple(int(d.constant.size) if d.HasField("constant") else None for d in t.dimensions)
    return _Tensor(int(t.dataType), dims)


def _op_name(op: Any) -> str:
    attr = op.attributes.get("name")
    if attr is not None and attr.immediateValue.tensor.strings.values:
        return str(attr.immediateValue.tensor.strings.values[0])
    return op.outputs[0].name if op.outputs else ""


def _iter_ops(block: Any) -> Iterator[Any]:
    for op in block.operations:
        yield op
        for inner in op.blocks:
            yield from _iter_ops(inner)


def _arg_names(op: Any, name: str) -> list[str]:
    arg = op.inputs.get(name)
    return [b.name for b in arg.arguments if b.name] if arg is not None else []


class _Function:
    """One MIL function's ops, its vars' types, producers and consumers."""

    def __init__(self, name: str, func: Any) -> None:
        self.name = name
        block = func.block_specializations.get(func.opset) or next(iter(func.block_specializations.values()))
        self.ops = list(_iter_ops(block))
        self.types: dict[str, _Tensor] = {}
        self.producer: dict[str, Any] = {}
        self.consumers: dict[str, list[tuple[Any, str]]] = {}
        self.states: list[tuple[str, _Tensor]] = []
        self.inputs: list[tuple[str, _Tensor]] = []
        for inp in func.inputs:
            t = _tensor(inp.type)
            if t is None:
                continue
            self.types[inp.name] = t
            (self.states if inp.type.HasField("stateType") else self.inputs).append((inp.name, t))
        for op in self.ops:
            for out in op.outputs:
                t = _tensor(out.type)
                if t is not None:
                    self.types[out.name] = t
                self.producer[out.name] = op
            for key in op.inputs:
                for var in _arg_names(op, key):
                    self.consumers.setdefault(var, []).append((op, key))
        self.outputs = set(block.outputs)

    def storage(self, var: str) -> bool:
        """A const only read by constexpr ops: compressed storage, not a tensor the model computes with."""
        uses = self.consumers.get(var, [])
        return bool(uses) and all(op.type.startswith("constexpr_") for op, _ in uses)

    def constant(self, var: str) -> bool:
        op = self.producer.get(var)
        return op is not None and (op.type == "const" or op.type.startswith("constexpr_"))

    def gather_table(self, var: str) -> bool:
        """A constant table read only as the `x` of gather ops (an embedding lookup)."""
        uses = self.consumers.get(var, [])
        return self.constant(var) and bool(uses) and all(op.type in ANE_GATHER_OPS and key == "x" for op, key in uses)

    def bool_arg(self, op: Any, name: str) -> bool:
        """The value of a bool input of `op` (a named const or an inline value); False if absent."""
        arg = op.inputs.get(name)
        if arg is None or not arg.arguments:
            return False
        binding = arg.arguments[0]
        value = binding.value if not binding.name else None
        if binding.name:
            producer = self.producer.get(binding.name)
            if producer is None or "val" not in producer.attributes:
                return False
            value = producer.attributes["val"]
        bools = value.immediateValue.tensor.bools.values if value is not None else []
        return bool(bools and bools[0])

    def arg_type(self, op: Any, name: str) -> _Tensor | None:
        """The type of input `name` of `op`: a named var's, or an inline value's."""
        arg = op.inputs.get(name)
        if arg is None or not arg.arguments:
            return None
        binding = arg.arguments[0]
        return self.types.get(binding.name) if binding.name else _tensor(binding.value.type)


class _Checker:
    def __init__(self, device: Device) -> None:
        self.device = device
        self.findings: list[Finding] = []
        self._seen: set[tuple[str, str, str]] = set()

    def add(self, rule_id: str, why: str, function: str = "", op: Any = None, var: str = "") -> None:
        rule = RULES[rule_id]
        if self.device not in rule.devices:
            return
        op_text = f"{op.type} {_op_name(op)}" if op is not None else ""
        key = (rule_id, op_text, var)  # a weight shared by several functions is reported once
        if key in self._seen:
            return
        self._seen.add(key)
        self.findings.append(Finding(rule_id, rule.severity, function, op_text, var, why, rule.source, rule.fix))

    def function(self, f: _Function) -> None:
        self._tensors(f)
        self._ops(f)
        self._states(f)

    def _tensors(self, f: _Function) -> None:
        named: list[tuple[str, Any]] = [(n, None) for n, _ in f.inputs + f.states]
        inputs = {n for n, _ in f.inputs}
        named += [(out.name, op) for op in f.ops for out in op.outputs]
        copied = _interface_copies(f, ANE_MAX_DIM if self.device == "ane" else ANY_MAX_DIM)
        for var, op in named:
            t = f.types.get(var)
            if t is None or f.storage(var):
                continue
            if var in copied:
                if copied[var]:
                    self.add("interface-copy", copied[var], f.name, op, var)
                continue
            if f.gather_table(var):
                if any(d is not None and d > ANE_MAX_DIM for d in t.dims):
                    self.add("embedding-gather", f"table {list(t.dims)} read by gather: not flagged", f.name, op, var)
                continue
            if len(t.dims) > 4:
                self.add("rank-over-4", f"rank {len(t.dims)} tensor {_shape(t)}", f.name, op, var)
            big = max((d for d in t.dims if d is not None), default=0)
            # A model input or output is the app's interface: no form of the program moves it.
            interface = (" (a model input: its shape is the interface's)" if op is None and var in inputs else
                         " (a model output: its shape is the interface's)" if var in f.outputs else "")
            if big > ANY_MAX_DIM:
                self.add("dim-over-65536", f"dim {big:,} in {_shape(t)}{interface}", f.name, op, var)
            elif big > ANE_MAX_DIM:
                self.add("dim-over-16384", f"dim {big:,} in {_shape(t)}{interface}", f.name, op, var)

    def _ops(self, f: _Function) -> None:
        fp32 = [op for op in f.ops if _computes_fp32(f, op)]
        if fp32:
            self.add("ane-fp32-compute", f"{counted(len(fp32), 'op')} compute{'s' * (len(fp32) == 1)} in fp32 (first: {fp32[0].type} {_op_name(fp32[0])})",
                     f.name)
        for op in f.ops:
            if op.type in ANE_UNSUPPORTED_OPS:
                self.add("ane-unsupported-op", f"{op.type} does not run on the Neural Engine", f.name, op)
            elif op.type in ANE_GATHER_OPS and not all(f.constant(v) for v in _arg_names(op, "x")):
                self.add("ane-unsupported-op", f"{op.type} of a computed tensor", f.name, op)
            elif op.type == "constexpr_blockwise_shift_scale":
                block = _per_block(f, op)
                if block:
                    self.add("ane-per-block-int", block, f.name, op, op.outputs[0].name)
            elif op.type == "add" and _summed_tables(f, op):
                # A GGUF 5-bit weight held split: its per-block scale is applied at run time.
                self.add("ane-per-block-int", "5-bit codes as two tables summed, then a per-block scale at run time",
                         f.name, op, op.outputs[0].name)
            elif op.type == "mul" and (table := _scaled_table(f, op)) is not None:
                # A GGUF 2-, 3- or 6-bit weight held split: its per-block scale is applied at run time.
                bits = _palette_bits(f, table)
                self.add("ane-per-block-int", f"{bits}-bit codes as a table, then a per-block scale at run time",
                         f.name, op, op.outputs[0].name)
            elif op.type in ("linear", "conv", "matmul"):
                self._notch(f, op)

    def _notch(self, f: _Function, op: Any) -> None:
        names = _arg_names(op, "y" if op.type == "matmul" else "weight")
        if not names or f.producer.get(names[0]) is None or f.producer[names[0]].type != "const":
            return  # compressed weights stream in their compressed form
        dims = f.types[names[0]].dims if names[0] in f.types else None
        if not dims or len(dims) < 2 or any(d is None for d in dims):
            return
        if op.type == "matmul":  # y is [D, N], or [N, D] with transpose_y
            if len(dims) != 2:
                return
            dims = dims if f.bool_arg(op, "transpose_y") else (dims[1], dims[0])
        n, d = int(dims[0] or 0), int(dims[1] or 0)
        kernel = 1
        for k in dims[2:]:
            kernel *= int(k or 1)
        payload = core_payload(n, d, kernel)
        if on_notch(payload):
            self.add("ane-dma-notch", f"weight [N, D, k...] = {list(dims)}: {payload:,} bytes per core"
                     f" ({payload / MIB:.3f} MiB)", f.name, op, names[0])

    def _states(self, f: _Function) -> None:
        for name, t in f.states:
            bad = [f"dim {axis} = {t.dims[axis]}" for axis in range(max(0, len(t.dims) - 2), len(t.dims))
                   if (t.dims[axis] or 0) % 32]
            if bad:
                self.add("state-dim-32", f"state {_shape(t)}: {', '.join(bad)} not a multiple of 32", f.name, None, name)
        if f.states:
            flexible = [n for n, t in f.inputs if any(d is None for d in t.dims)]
            if flexible:
                self.add("flexible-shape-state", f"states {[n for n, _ in f.states]} with flexible inputs {flexible}",
                         f.name)


def _wide(t: _Tensor | None, limit: int) -> bool:
    return t is not None and any(d is not None and d > limit for d in t.dims)


def _moves_data(f: _Function, op: Any, inputs: set[str]) -> bool:
    """A data-movement op, or a cast at the program's boundary (an fp16 program's cast of an fp32
    input or output, as `_computes_fp32` counts it: the conversion of the copy)."""
    if op.type == "cast":
        read = [v for key in op.inputs for v in _arg_names(op, key)]
        return any(v in inputs for v in read) or any(o.name in f.outputs for o in op.outputs)
    return op.type in DATA_MOVEMENT_OPS


def _interface_copies(f: _Function, limit: int) -> dict[str, str]:
    """The tensors wider than `limit` that no compute op reads or writes: each group of them
    that data-movement ops link holds a model input or output, every one is made by a
    data-movement op (or is the input) and read only by data-movement ops (or is the output),
    so the only ops touching them cut the input into, or join the output from, pieces within
    `limit`. Maps each to the note's text for the model's input or output, "" for the others
    (the copies between them)."""
    inputs = {n for n, _ in f.inputs}
    wide = {v for v, t in f.types.items() if _wide(t, limit) and not f.storage(v) and not f.gather_table(v)}
    notes: dict[str, str] = {}
    seen: set[str] = set()
    for start in sorted(wide & (inputs | f.outputs)):
        if start in seen:
            continue
        group, todo, ok = {start}, [start], True
        ops: dict[int, Any] = {}
        while todo:
            var = todo.pop()
            producer = f.producer.get(var)
            links = [user for user, _ in f.consumers.get(var, [])] + ([producer] if producer is not None else [])
            if producer is None and var not in inputs:
                ok = False  # a state
            for op in links:
                if not _moves_data(f, op, inputs):
                    ok = False
                    continue
                ops[id(op)] = op
                touched = [o.name for o in op.outputs] + [v for key in op.inputs for v in _arg_names(op, key)]
                for other in touched:
                    if other in wide and other not in group:
                        group.add(other)
                        todo.append(other)
        seen |= group
        if not ok:
            continue
        kinds = sorted({op.type for op in ops.values()})
        for var in group:
            notes[var] = ""
            if var not in inputs and var not in f.outputs:
                continue
            t = f.types[var]
            size = _DTYPE_BYTES.get(t.dtype, 4)
            for d in t.dims:
                size *= d or 1
            role = "model input" if var in inputs else "model output"
            verb = "cut into" if var in inputs else "joined from"
            notes[var] = (f"{role} {_shape(t)} only moved ({', '.join(kinds)}): {verb} pieces within {limit:,};"
                          f" a copy of {size:,} bytes per prediction, no compute op reads or writes it")
    return notes


def _shape(t: _Tensor) -> str:
    return f"{_DTYPE_NAMES.get(t.dtype, str(t.dtype))}[{', '.join('?' if d is None else str(d) for d in t.dims)}]"


def _computes_fp32(f: _Function, op: Any) -> bool:
    if op.type == "const" or op.type.startswith("constexpr_"):
        return False
    outs = [o.name for o in op.outputs if f.types.get(o.name, _Tensor(0, ())).dtype == _FP32]
    if not outs:
        return False
    # an fp16 program's casts of its fp32 inputs/outputs at the boundary are not compute
    return not (op.type == "cast" and all(o in f.outputs for o in outs))


def _summed_tables(f: _Function, op: Any) -> bool:
    """An `add` of two `constexpr_lut_to_dense` outputs (a weight's code split in two tables)."""
    names = _arg_names(op, "x") + _arg_names(op, "y")
    return len(names) == 2 and all(getattr(f.producer.get(n), "type", None) == "constexpr_lut_to_dense" for n in names)


def _scaled_table(f: _Function, op: Any) -> Any:
    """The `constexpr_lut_to_dense` whose output, reshaped into blocks, a `mul` by a constant
    scales (a weight's code held as a table of its own width, the block scale at run time)."""
    for side, other in (("x", "y"), ("y", "x")):
        names, consts = _arg_names(op, side), _arg_names(op, other)
        blocks = f.producer.get(names[0]) if len(names) == 1 else None
        if any(not f.constant(n) for n in consts) or getattr(blocks, "type", None) != "reshape":
            continue
        source = _arg_names(blocks, "x")
        table = f.producer.get(source[0]) if len(source) == 1 else None
        if getattr(table, "type", None) == "constexpr_lut_to_dense":
            return table
    return None


def _per_block(f: _Function, op: Any) -> str:
    data, scale = f.arg_type(op, "data"), f.arg_type(op, "scale")
    if data is None or scale is None or len(data.dims) != len(scale.dims):
        return ""
    d = data.dims
    for axis, (dd, ss) in enumerate(zip(d, scale.dims, strict=True)):
        if dd is not None and ss is not None and 1 < ss < dd:
            dtype = data.dtype
            return (f"{_DTYPE_NAMES.get(dtype, str(dtype))} weight {list(d)} in blocks of {dd // ss} along axis {axis}")
    return ""


def _palette_bits(f: _Function, op: Any) -> int | None:
    indices = f.arg_type(op, "indices")
    if indices is not None and indices.dtype == _UINT4:
        return 4
    lut_dims: tuple[int | None, ...] | None = None
    lut = f.arg_type(op, "lut")
    if lut is not None:
        lut_dims = lut.dims
    elif "lut" in op.attributes:  # iOS16: lut and indices are attributes
        t = _tensor(op.attributes["lut"].type)
        lut_dims = t.dims if t is not None else None
    if not lut_dims:
        return None
    size = lut_dims[-2] if len(lut_dims) >= 2 else lut_dims[0]
    return max(1, (int(size) - 1).bit_length()) if size else None


def _one_table(f: _Function, op: Any) -> bool:
    """Whether a palettized weight has one table for all of it (iOS16's form always has):
    iOS18's `lut` is [*groups per indices axis, entries, vector size], all groups 1."""
    lut = f.arg_type(op, "lut")
    if lut is None or not lut.dims:
        return True
    return all(d == 1 for d in lut.dims[:-2])


def _feeds_block_scale(f: _Function, op: Any) -> bool:
    """A palette whose entries are codes a `constexpr_blockwise_shift_scale` scales (the
    LUT-then-scale form Core ML keeps from iOS26 on, e.g. GGUF codes)."""
    uses = f.consumers.get(op.outputs[0].name, []) if op.outputs else []
    return bool(uses) and all(user.type == "constexpr_blockwise_shift_scale" and key == "data" for user, key in uses)


def _weight_files(model: Any, path: Path | None) -> list[Path]:
    folder = Path(model.weights_dir) if getattr(model, "weights_dir", None) else None
    if folder is None and path is not None:
        folder = path / "Data" / "com.apple.CoreML" / "weights"
    if folder is None or not folder.is_dir():
        return []
    return sorted(p for p in folder.rglob("*") if p.is_file())


def preflight(model_or_path: Any, device: str = "ane") -> list[Finding]:
    """Check an `MLModel` or a saved `.mlpackage` (any, not only rlx_mil's) against the published
    Core ML rules for `device` ("ane": the Neural Engine, "gpu"): the rules it breaks, as
    `Finding`s (errors, warnings; notes for exemptions such as an embedding table read by gather).
    An empty list (or only notes) means no known rule is broken; docs/deploying.md has the table."""
    if device not in DEVICES:
        raise InvalidOptionError(f"preflight: device must be one of {', '.join(DEVICES)}, got {device!r}")
    model, path = open_model(model_or_path)
    spec = model.get_spec()
    if spec.WhichOneof("Type") != "mlProgram":
        raise RlxMilError(f"{path or 'model'}: not an ML Program (model type {spec.WhichOneof('Type')}); preflight"
                          " checks ML Programs only")
    checker = _Checker(device)
    functions = [_Function(name, func) for name, func in spec.mlProgram.functions.items()]
    for f in functions:
        checker.function(f)
    flexible = [d.name for d in spec.description.input if d.type.HasField("multiArrayType")
                and d.type.multiArrayType.WhichOneof("ShapeFlexibility") is not None]
    stateful = [f for f in functions if f.states]
    if flexible and stateful:
        checker.add("flexible-shape-state", f"states with flexible inputs {flexible}", stateful[0].name)
    meta = spec.description.metadata.userDefined
    # rlx_mil's own packages do not record coremltools' version, but rlx_mil requires 9.0.x
    version = meta.get(_CT_VERSION) or ("9.0 (rlx_mil requires it)" if _RLX_MIL_VERSION in meta else "")
    if stateful and (version == "9.0" or version.startswith(("9.0.", "9.0b", "9.0 "))):
        lut4 = [(f, op) for f in functions for op in f.ops
                if op.type == "constexpr_lut_to_dense" and (_palette_bits(f, op) or 9) <= 4]
        scaled = [(f, op) for f, op in lut4 if _feeds_block_scale(f, op)]
        whole = [(f, op) for f, op in lut4 if _one_table(f, op) and (f, op) not in scaled]
        grouped = [(f, op) for f, op in lut4 if not _one_table(f, op) and (f, op) not in scaled]
        for rule, found, kind in (("lut4-state-coremltools-9.0", whole, "one table per weight"),
                                  ("lut4-grouped-state-coremltools-9.0", grouped, "a table per group of channels"),
                                  ("lut-scale-state-coremltools-9.0", scaled,
                                   "a table of integers, then a per-block scale (iOS26)")):
            if found:
                f, op = found[0]
                checker.add(rule, f"{counted(len(found), 'weight')} palettized to <= 4 bits ({kind}), states, built"
                            f" with coremltools {version}", f.name, op, op.outputs[0].name)
    for file in _weight_files(model, path):
        size = file.stat().st_size
        if size > MACOS_MAX_WEIGHT_FILE:
            checker.add("weight-file-over-2GB", f"{file.name}: {size:,} bytes", var=file.name)
        elif size > IOS_MAX_WEIGHT_FILE:
            checker.add("weight-file-over-1GB", f"{file.name}: {size:,} bytes", var=file.name)
    return checker.findings
