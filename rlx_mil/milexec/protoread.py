"""Reading a saved package straight from its Core ML protobuf into light ops the executor runs.

coremltools' milproto loader (`load_program`) builds a pymil Program: every op goes through the
MIL Builder with its input validation, type inference and value inference, for every function
of the package (docs/milexec.md has the figures). The executor needs much less from an op: its
type, name, inputs by name, output vars with their declared dtype and shape, const values, and
the opset of its definition. `read_program` builds exactly that from the protobuf, following
what the milproto loader does:

* output vars take the types the package declares; a const's value and type come from
  coremltools' own const rules (`Const._get_type_val`: int64 consts become int32, float64
  float32...), and weights are read through the loader's memory map (`loader._mapped_weights`:
  no copies, one read of a blob the functions share);
* inputs a package leaves out get the defaults pymil's op definition gives them
  (`default_inputs`), as const ops in front of the op, named as pymil names them;
* `write_state` becomes `coreml_update_state`, merged with a `read_state` of the same state
  right after it; parameters a constexpr op holds as attributes become const ops.

What it does not cover (nested blocks, list and dictionary values, literal non-const inputs,
unknown op types, anything it finds unexpected) makes it return None: the caller then loads the
package with `load_program`, whose errors for malformed packages stay what they were.
"""

from __future__ import annotations

import collections
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from rlx_mil.milexec.light import LightFunction, LightOp, LightProgram, LightVar
from rlx_mil.milexec.loader import _mapped_weights, _open_model


class Unsupported(Exception):
    """Something `read_program` leaves to coremltools' loader."""


def read_program(path: str | os.PathLike[str], functions: Sequence[str] | None = None, *,
                 packed_4bit: bool = False) -> LightProgram | None:
    """The package at `path` as light functions (`functions`: only those, default every one),
    or None when something in it is left to `load_program` (see the module doc).
    `packed_4bit`: 4-bit blobs as `loader.FourBitCodes` stand-ins, as `load_program` reads them.

    Raises MilExecError where `load_program` would before reading the program (no package,
    a special file inside it, not an ML Program)."""
    return read_model(_open_model(path), path, functions, packed_4bit=packed_4bit)


def read_model(model: Any, where: Any, functions: Sequence[str] | None = None, *,
               packed_4bit: bool = False, default_only: bool = False) -> LightProgram | None:
    """`read_program` for a coremltools MLModel opened from its package (`where` names it);
    `default_only`: only the default function (its `all_functions` lists every name)."""
    from rlx_mil.errors import MilExecError

    spec = model.get_spec()
    if spec.WhichOneof("Type") != "mlProgram":
        raise MilExecError(f"{where} is not an ML Program (model type {spec.WhichOneof('Type')!r})")
    try:
        with _mapped_weights(packed_4bit):
            return _Reader(spec, model.weights_dir).program(functions, default_only)
    except Unsupported:
        return None
    except Exception:  # anything unexpected: coremltools' loader decides (and names the fault)
        return None


class _Reader:
    def __init__(self, spec: Any, weights_dir: str) -> None:
        from coremltools.converters.mil._deployment_compatibility import AvailableTarget
        from coremltools.converters.mil.frontend.milproto import load as milproto
        from coremltools.proto import MIL_pb2

        self.spec = spec
        self.milproto = milproto
        self.string = MIL_pb2.STRING
        self.context = milproto.TranscriptionContext(weights_dir)
        try:
            self.opset = AvailableTarget(spec.specificationVersion)
        except ValueError as exc:
            raise Unsupported(str(exc)) from exc
        self.names: dict[str, int] = collections.defaultdict(int)
        self.classes: dict[str, Any] = {}

    def program(self, wanted: Sequence[str] | None, default_only: bool = False) -> LightProgram:
        program = self.spec.mlProgram
        if program.docString or program.version != 1 or any(a != "buildInfo" for a in program.attributes):
            raise Unsupported("program attributes")
        every = list(program.functions)
        default = self.spec.description.defaultFunctionName or "main"
        names = [n for n in every if n in set(wanted)] if wanted is not None else every
        if default_only:
            names = [n for n in names if n == default]
        functions = {name: self.function(name, program.functions[name]) for name in names}
        return LightProgram(functions=functions, default_function_name=default, all_functions=tuple(every))

    # -- functions and ops ------------------------------------------------------------------
    def function(self, name: str, spec: Any) -> LightFunction:
        from coremltools.converters.mil.mil import types

        if spec.attributes or spec.opset not in spec.block_specializations:
            raise Unsupported("function attributes or opset")
        function = LightFunction(name=name, opset_version=self.opset)
        scope: dict[str, LightVar] = {}
        for named in spec.inputs:
            sym_type = self.types(named.type)
            if not (types.is_tensor(sym_type) or types.is_state(sym_type)):
                raise Unsupported("function input type")
            var = LightVar(named.name, sym_type)
            function.inputs[named.name] = var
            scope[named.name] = var
        block = spec.block_specializations[spec.opset]
        if block.attributes:
            raise Unsupported("block attributes")
        for op_spec in block.operations:
            self.operation(op_spec, function, scope)
            self.merge_state_ops(function, scope)
        function.outputs = [self.lookup(scope, output) for output in block.outputs]
        return function

    def operation(self, spec: Any, function: LightFunction, scope: dict[str, LightVar]) -> None:
        from coremltools.converters.mil.mil.input_type import InternalInputType, TupleInputType

        op_type = spec.type
        if spec.blocks:
            raise Unsupported("nested blocks")
        attributes = {k: self.name(v) if k == "name" else self.value(v) for k, v in spec.attributes.items()}
        name = attributes.pop("name", None)
        is_const = op_type == "const" or "constexpr_" in op_type
        if op_type == "const":
            if spec.inputs or set(attributes) != {"val"} or len(spec.outputs) != 1:
                raise Unsupported("const form")
            op = self.const_op(name or self.fresh("const"), attributes["val"], function)
            self.bind_outputs(op, spec, scope, declared=False)
            return
        if not is_const and attributes:
            raise Unsupported("attributes on an op")
        pymil_type = "coreml_update_state" if op_type == "write_state" else op_type
        op_class = self.op_class(pymil_type)
        if op_type == "write_state" or not name:  # coremltools' loader drops a write_state's name
            name = self.fresh(pymil_type)
        op = LightOp(pymil_type, name, op_class, function)
        input_types = op_class.input_spec.input_types
        if any(isinstance(t, InternalInputType) for t in input_types.values()):
            raise Unsupported("internal inputs")
        for param, argument in spec.inputs.items():
            bound = []
            for binding in argument.arguments:
                kind = binding.WhichOneof("binding")
                if kind == "name":
                    bound.append(self.lookup(scope, binding.name))
                elif kind == "value" and is_const:
                    bound.append(self.const_op(self.fresh(f"{name}_{param}"), self.value(binding.value), function).outputs[0])
                else:
                    raise Unsupported("literal input")
            if op_type == "write_state":
                param = {"input": "state", "data": "value"}.get(param, param)
                op.inputs[param] = bound[0]
                continue
            if param not in input_types:
                raise Unsupported("unknown input")
            tuple_input = isinstance(input_types[param], TupleInputType)
            op.inputs[param] = bound[0] if len(bound) == 1 and (is_const or not tuple_input) else tuple(bound)
        for param, value in attributes.items():  # constexpr parameters held as attributes
            if param not in input_types:
                raise Unsupported("unknown attribute")
            op.inputs[param] = self.const_op(self.fresh(f"{name}_{param}"), value, function).outputs[0]
        self.fill_defaults(op, function)
        for value in op.inputs.values():
            for var in value if isinstance(value, tuple) else (value,):
                var.child_ops.append(op)
        function.operations.append(op)
        if op_type == "write_state":
            if spec.outputs or set(op.inputs) != {"state", "value"}:
                raise Unsupported("write_state form")
            value = op.inputs["value"]
            op.outputs = [LightVar(op.name, value.sym_type, op)]
            return
        self.bind_outputs(op, spec, scope, declared=True)

    def bind_outputs(self, op: LightOp, spec: Any, scope: dict[str, LightVar], *, declared: bool) -> None:
        if declared:
            op.outputs = [LightVar(out.name, self.types(out.type), op) for out in spec.outputs]
        elif len(op.outputs) != len(spec.outputs):
            raise Unsupported("outputs")
        for var, out in zip(op.outputs, spec.outputs, strict=True):
            var.name = out.name
            scope[out.name] = var

    def merge_state_ops(self, function: LightFunction, scope: dict[str, LightVar]) -> None:
        """`coreml_update_state` then `read_state` of the same state: the read is the update's
        output (what coremltools' loader does)."""
        ops = function.operations
        if len(ops) < 2 or ops[-2].op_type != "coreml_update_state" or ops[-1].op_type != "read_state":
            return
        update, read = ops[-2], ops[-1]
        if update.inputs.get("state") is not read.inputs.get("input"):
            return
        update.outputs[0].name = read.outputs[0].name
        scope[read.outputs[0].name] = update.outputs[0]
        read.inputs["input"].child_ops.remove(read)
        ops.pop()

    def fill_defaults(self, op: LightOp, function: LightFunction) -> None:
        """The optional inputs `op` does not give, with the values pymil's definition gives them."""
        from coremltools.converters.mil.mil.input_type import TupleInputType

        missing = [k for k in op.op_class.input_spec.input_types if k not in op.inputs]
        if not missing:
            return
        shim = object.__new__(op.op_class)
        for key in op.op_class.input_spec.input_types:
            setattr(shim, key, op.inputs.get(key))
        shim.name = op.name
        for key, value in op.op_class.default_inputs(shim).items():
            if key in missing and value is not None:
                if isinstance(op.op_class.input_spec.input_types[key], TupleInputType):
                    raise Unsupported("a tuple default")
                op.inputs[key] = self.const_op(self.fresh(f"{op.name}_{key}"), value, function).outputs[0]
        for key in missing:
            if key not in op.inputs and not op.op_class.input_spec.input_types[key].optional:
                raise Unsupported(f"required input {key!r} missing")

    def const_op(self, name: str, value: Any, function: LightFunction) -> LightOp:
        """A const op holding `value`, typed and valued as pymil's `const` makes it."""
        sym_type, val = _const_type_val(value)
        if isinstance(val, np.bool_):  # as `load_program` leaves it (numpy >= 2 reduce keepdims)
            val = bool(val)
        op = LightOp("const", name, self.op_class("const"), function)
        op.outputs = [LightVar(name, sym_type, op, val)]
        function.operations.append(op)
        return op

    # -- values, types, names ---------------------------------------------------------------
    def name(self, spec: Any) -> str:
        """The string an op's "name" attribute holds."""
        strings = spec.immediateValue.tensor.strings.values
        kind = spec.type.tensorType
        if (spec.WhichOneof("value") != "immediateValue" or kind.rank != 0 or len(strings) != 1
                or kind.dataType != self.string or spec.docString):
            raise Unsupported("op name")
        return str(strings[0])

    def value(self, spec: Any) -> Any:
        kind = spec.type.WhichOneof("type")
        if kind != "tensorType":
            raise Unsupported(f"{kind} value")
        return self.milproto._load_value(self.context, spec)

    def types(self, spec: Any) -> Any:
        from coremltools.converters.mil.frontend.milproto.helper import proto_to_types
        from coremltools.converters.mil.mil import types

        if spec.WhichOneof("type") == "tensorType":  # the common case, as proto_to_types reads it
            tensor = spec.tensorType
            dims = tensor.dimensions
            if tensor.rank == len(dims) and not len(tensor.attributes) and tensor.dataType in types.PROTO_TO_BUILTIN_TYPE:
                shape = [d.constant.size for d in dims if d.WhichOneof("dimension") == "constant"]
                if len(shape) == len(dims):
                    dtype = types.PROTO_TO_BUILTIN_TYPE[tensor.dataType]
                    return types.tensor(dtype, shape) if shape or tensor.rank else dtype
        sym_type = proto_to_types(spec)
        if types.is_list(sym_type) or types.is_dict(sym_type):
            raise Unsupported("list or dictionary type")
        return sym_type

    def op_class(self, op_type: str) -> Any:
        if op_type not in self.classes:
            from coremltools.converters.mil.mil.ops.helper import _get_version_of_op
            from coremltools.converters.mil.mil.ops.registry import SSAOpRegistry

            variants = SSAOpRegistry.core_ops.get(op_type)
            if variants:
                self.classes[op_type] = _get_version_of_op(variants, self.opset)
            elif op_type in SSAOpRegistry.dialect_ops:  # coreml_update_state
                self.classes[op_type] = SSAOpRegistry.dialect_ops[op_type]
            else:
                raise Unsupported(f"op type {op_type!r}")
        return self.classes[op_type]

    def lookup(self, scope: dict[str, LightVar], name: str) -> LightVar:
        if name not in scope:
            raise Unsupported(f"var {name!r} not defined")
        return scope[name]

    def fresh(self, name: str) -> str:
        """`name` with a count appended, as pymil names the vars it makes up (its count is
        per process, this one per package: a made-up name may differ in that number)."""
        count = self.names[name]
        self.names[name] += 1
        return f"{name}_{count}"


def _const_type_val(value: Any) -> tuple[Any, Any]:
    """(builtin type, value) of a const holding `value`: coremltools' `const` type and value
    inference, then what its Var does to a sub-byte value."""
    from coremltools.converters.mil.mil import types
    from coremltools.converters.mil.mil.ops.defs.iOS15.control_flow import Const

    shim = object.__new__(Const)
    shim.name = "const"
    sym_type, val = Const._get_type_val(shim, value)
    holder = sym_type()
    holder.val = val
    val = holder.val
    dtype = sym_type.get_primitive() if types.is_tensor(sym_type) else sym_type
    if types.is_sub_byte(dtype) and isinstance(val, (np.generic, np.ndarray)) and (
        val.dtype.metadata is None or types.SUB_BYTE_DTYPE_METADATA_KEY not in val.dtype.metadata
    ):
        val = val.astype(types.nptype_from_builtin(dtype))
    return sym_type, val
