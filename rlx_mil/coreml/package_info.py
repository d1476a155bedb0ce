"""Summaries of converted models and saved `.mlpackage` folders (what `rlx-mil inspect` prints)."""

from __future__ import annotations

import json
import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlx_mil.coreml.metadata import (
    GRAPH,
    LLM,
    SOURCE,
    SPLIT_OUTPUTS,
    LLMContract,
    ModelSource,
    PackageMetadataError,
    SplitOutputs,
)
from rlx_mil.coreml.package_items import TEXT_ITEM, item_folder
from rlx_mil.errors import RlxMilError
from rlx_mil.fileio import check_package_tree
from rlx_mil.units import counted, human_bytes

#: Core ML specification version -> the deployment target that introduced it.
SPEC_VERSION_TARGETS = {6: "iOS15", 7: "iOS16", 8: "iOS17", 9: "iOS18", 10: "iOS26"}

_IO_TYPES = {65568: "fp32", 65552: "fp16", 131104: "int32", 65600: "fp64", 131080: "int8"}


@dataclass
class TensorInfo:
    name: str
    shape: list[int]
    dtype: str


@dataclass
class PackageInfo:
    path: str | None
    target: str
    spec_version: int
    inputs: list[TensorInfo]
    outputs: list[TensorInfo]
    op_histogram: dict[str, int]
    weight_bytes: int
    package_bytes: int
    metadata: dict[str, str] = field(default_factory=dict)
    #: Core ML states (a stateful model's KV cache), fp16.
    states: list[TensorInfo] = field(default_factory=list)
    #: Functions of a multifunction package: name -> {"inputs", "outputs", "states"}.
    functions: dict[str, dict[str, list[TensorInfo]]] = field(default_factory=dict)
    default_function: str | None = None
    #: Core ML's model description: author, license, short_description, version (those set).
    description: dict[str, str] = field(default_factory=dict)
    #: Files of the package's `rlx_mil/tokenizer` item (tokenizer, chat template, generation config).
    text_files: list[str] = field(default_factory=list)
    text_folder: str | None = None
    #: The source model (`ModelSource` as a dict: name, named_by, architecture, parameters).
    model: dict[str, Any] | None = None

    @property
    def num_ops(self) -> int:
        return sum(n for op, n in self.op_histogram.items() if op != "const")

    def to_text(self) -> str:
        lines = [f"package:  {self.path or '(in memory)'}", f"target:   {self.target} (spec version {self.spec_version})"]
        try:
            source = ModelSource.read(self.metadata)
        except PackageMetadataError as err:
            lines.append(f"model:    the {SOURCE!r} metadata is malformed ({err})")
        else:
            if source is not None:
                lines.append(f"model:    {source.to_text()}")
        graph = self.metadata.get(GRAPH)
        if graph:
            lines.append(f"graph:    {graph} (precision {self.metadata.get('rlx_mil.precision', '?')})")
        lines += [f"{name + ':':<9} {value}" for name, value in self.description.items()]
        if self.inputs or self.outputs or not self.functions:  # a multifunction package: per function below
            lines.append("inputs:")
            lines += [f"  {t.name}: {t.dtype}{t.shape}" for t in self.inputs]
            lines.append("outputs:")
            lines += [f"  {t.name}: {t.dtype}{t.shape}" for t in self.outputs]
        if self.states:
            lines.append("states:")
            lines += [f"  {t.name}: {t.dtype}{t.shape}" for t in self.states]
        lines += self._function_lines()
        lines.append(f"ops:      {self.num_ops} (plus {self.op_histogram.get('const', 0)} const)")
        for op, n in sorted(self.op_histogram.items(), key=lambda kv: (-kv[1], kv[0])):
            if op != "const":
                lines.append(f"  {op:<36} {n}")
        if self.text_folder:
            lines.append(f"text:     {self.text_folder}: {', '.join(self.text_files)}")
        lines.append(f"weights:  {human_bytes(self.weight_bytes)}")
        lines.append(f"package:  {human_bytes(self.package_bytes)}")
        from rlx_mil.compress.report import report_of

        compression = report_of(self.metadata)
        if compression is not None:
            lines.append(compression.to_text())
        return "\n".join(lines)

    def _function_lines(self) -> list[str]:
        lines = []
        if self.functions:
            lines.append(f"functions: {len(self.functions)} (default {self.default_function})")
            for name, parts in self.functions.items():
                lines.append(f"  {name}:")
                for kind in ("inputs", "outputs", "states"):
                    text = ", ".join(f"{t.name} {t.dtype}{t.shape}" for t in parts[kind])
                    if text:
                        lines.append(f"    {kind + ':':<9}{text}")
        try:
            contract = LLMContract.read(self.metadata)
            if contract is not None:
                lines.append(
                    f"kv cache: {contract.layout}, {counted(contract.layers, 'layer')}, max_context {contract.max_context},"
                    f" write position input {contract.cache_position!r}"
                )
                lines += [f"  note: {n}" for n in contract.neural_engine_notes]
        except PackageMetadataError as err:
            # inspect describes what is there; a damaged contract is part of that description
            lines.append(f"kv cache: the {LLM!r} metadata is malformed ({err})")
        try:
            split = SplitOutputs.read(self.metadata)
        except PackageMetadataError as err:
            return [*lines, f"split outputs: the {SPLIT_OUTPUTS!r} metadata is malformed ({err})"]
        for function, outputs in split.functions.items():
            for name, entry in outputs.items():
                lines.append(f"split output: {function}: {name} = concat({', '.join(entry.pieces)}; axis {entry.axis})"
                             f", widths {list(entry.sizes)}")
        return lines

    def to_json(self) -> str:
        return json.dumps(self.__dict__, default=lambda o: o.__dict__, indent=2)


def _tree_bytes(path: Path) -> int:
    if not path.exists():
        return 0
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def _count_ops(block: Any, counts: Counter[str]) -> None:
    for op in block.operations:
        counts[op.type] += 1
        for inner in op.blocks:
            _count_ops(inner, counts)


def _tensor_infos(features: Any) -> list[TensorInfo]:
    out = []
    for feat in features:
        kind = feat.type.WhichOneof("Type")
        arr = feat.type.stateType.arrayType if kind == "stateType" else feat.type.multiArrayType
        out.append(TensorInfo(feat.name, [int(s) for s in arr.shape], _IO_TYPES.get(arr.dataType, str(arr.dataType))))
    return out


def open_model(model_or_path: Any) -> tuple[Any, Path | None]:
    """(`MLModel`, its package path or None) of an `MLModel` or a saved `.mlpackage` path, read
    without compiling it (`skip_model_load`); a typed error for a missing or unreadable package."""

    path: Path | None
    if isinstance(model_or_path, (str, os.PathLike)):
        path = Path(model_or_path)
        if not path.exists():
            raise RlxMilError(f"{path}: no such package")
        check_package_tree(path)
        try:
            from rlx_mil.coreml.manifest import open_model

            model = open_model(path, skip_model_load=True)
        except RlxMilError:
            raise
        except Exception as err:
            raise RlxMilError(f"{path}: not a readable Core ML package ({type(err).__name__}: {err})") from None
        check_weight_files(path, model)
    else:
        model = model_or_path
        path = Path(model.package_path) if getattr(model, "package_path", None) else None
    return model, path


def check_weight_files(path: Path, model: Any) -> None:
    """Refuse a package whose program names weight blobs its weights folder does not hold (a
    file missing, or an offset past the file's end): read anyway, its weights would be
    reported as 0 bytes and its program could not run."""
    spec = model.get_spec()
    if spec.WhichOneof("Type") != "mlProgram":
        return
    furthest: dict[str, int] = {}
    for func in spec.mlProgram.functions.values():
        for block in func.block_specializations.values():
            _blob_offsets(block, furthest)
    weights = Path(getattr(model, "weights_dir", None) or path / "Data" / "com.apple.CoreML" / "weights")
    for name, offset in sorted(furthest.items()):
        file = weights / name.split("/")[-1]
        try:
            size = file.stat().st_size if file.is_file() else None
        except OSError:
            size = None
        if size is None:
            raise RlxMilError(f"{path}: its program reads weights from {name}, which the package does not hold ({file})")
        if offset >= size:
            raise RlxMilError(f"{path}: its program reads {name} at byte {offset}, past the file's end ({size} bytes)")


def _blob_offsets(block: Any, furthest: dict[str, int]) -> None:
    for op in block.operations:
        for value in op.attributes.values():
            if value.WhichOneof("value") == "blobFileValue":
                blob = value.blobFileValue
                furthest[blob.fileName] = max(furthest.get(blob.fileName, -1), int(blob.offset))
        for inner in op.blocks:
            _blob_offsets(inner, furthest)


def package_info(model_or_path: Any) -> PackageInfo:
    """Summarise an `MLModel` or a saved `.mlpackage` path."""
    model, path = open_model(model_or_path)
    spec = model.get_spec()
    if spec.WhichOneof("Type") != "mlProgram":
        raise RlxMilError(f"{path}: not an ML Program (model type {spec.WhichOneof('Type')})")
    counts: Counter[str] = Counter()
    for func in spec.mlProgram.functions.values():
        for block in func.block_specializations.values():
            _count_ops(block, counts)
    weights_dir = Path(model.weights_dir) if getattr(model, "weights_dir", None) else None
    text = item_folder(path, TEXT_ITEM) if path else None
    meta = spec.description.metadata
    return PackageInfo(
        path=str(path) if path else None,
        target=SPEC_VERSION_TARGETS.get(spec.specificationVersion, f"spec{spec.specificationVersion}"),
        spec_version=spec.specificationVersion,
        inputs=_tensor_infos(spec.description.input),
        outputs=_tensor_infos(spec.description.output),
        op_histogram=dict(counts),
        weight_bytes=_tree_bytes(weights_dir) if weights_dir else 0,
        package_bytes=_tree_bytes(path) if path else 0,
        metadata=dict(spec.description.metadata.userDefined),
        states=_tensor_infos(spec.description.state),
        functions={
            f.name: {"inputs": _tensor_infos(f.input), "outputs": _tensor_infos(f.output), "states": _tensor_infos(f.state)}
            for f in spec.description.functions
        },
        default_function=spec.description.defaultFunctionName or None,
        description={
            name: str(getattr(meta, attr)) for name, attr in
            (("author", "author"), ("license", "license"), ("short_description", "shortDescription"),
             ("version", "versionString"))
            if getattr(meta, attr)
        },
        text_files=sorted(p.name for p in text.iterdir() if p.is_file()) if text else [],
        text_folder=str(text.relative_to(path)) if text and path else None,
        model=_source_record(meta.userDefined),
    )


def _source_record(metadata: Any) -> dict[str, Any] | None:
    """`rlx_mil.source` for --json (None when absent or malformed: the text says which)."""
    import dataclasses

    try:
        source = ModelSource.read(dict(metadata))
    except PackageMetadataError:
        return None
    return dataclasses.asdict(source) if source is not None else None
