"""Core AI as an output: a converted package (MLModel or saved `.mlpackage`) written as a
`.aimodel` asset, and an asset opened again for running.

The asset holds the translated program (every function an entry point; Core AI stores equal
weights once, so a prefill + decode asset holds one copy; KV caches are states shared by
name), and beside it, in files Core AI's runtime ignores, what rlx_mil needs to drive it:
the package's metadata (LLM contract, io names, chat template...), its model description
(function interfaces, as Core ML declares them), the entry points' interfaces, and the
tokenizer files (`rlx_mil_text/`).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
from collections.abc import Mapping, MutableMapping
from pathlib import Path
from typing import Any

import numpy as np

from rlx_mil import interrupts
from rlx_mil.coreai import adapter
from rlx_mil.coreai.translate import EntryPoint, translate_program
from rlx_mil.errors import CoreAITranslationError, ExistingFileError, MilExecError, RlxMilError
from rlx_mil.ir.shape import MAX_TENSOR_ELEMENTS

ASSET_SUFFIX = ".aimodel"
#: The asset's metadata key saying the float type it computes in ('fp32' also for an fp16
#: package: the package's own precision stays under `rlx_mil.precision`).
COMPUTE_KEY = "rlx_mil.coreai.compute"
_ENTRIES_FILE = "rlx_mil_entries.json"
_DESCRIPTION_FILE = "rlx_mil_description.pb"
TEXT_FOLDER = "rlx_mil_text"


def is_asset(path: str | os.PathLike[str]) -> bool:
    return str(path).rstrip("/").endswith(ASSET_SUFFIX)


def save_aimodel(source: Any, output: str | os.PathLike[str], *, precision: str = "fp32",
                 overwrite: bool = False) -> Path:
    """Write `source` (a converted MLModel or a saved `.mlpackage` path) as the Core AI asset
    `output` (`.aimodel`). `precision` is the float type of the asset's compute ('fp32', or
    'fp16' for a device asset of an fp16 package: Apple's Linux runtime accumulates fp16 in
    fp16; `--compute` on the convert commands)."""
    from rlx_mil.coreml.package_info import open_model
    from rlx_mil.milexec.loader import resolve_source
    from rlx_mil.milexec.protoread import read_model

    out = Path(output)
    if out.suffix != ASSET_SUFFIX:
        raise RlxMilError(f"{out}: a Core AI asset's name ends in {ASSET_SUFFIX}")
    if out.exists() and not overwrite:
        raise ExistingFileError(f"{out} exists (pass overwrite=True / --overwrite to replace it)")
    if precision not in ("fp32", "fp16"):
        raise RlxMilError(f"precision must be 'fp32' or 'fp16', got {precision!r}")
    adapter.require()
    model, path = open_model(source)
    if precision == "fp16" and model.user_defined_metadata.get("rlx_mil.precision") == "fp32":
        from rlx_mil.errors import InvalidOptionError

        raise InvalidOptionError("fp16 compute needs an fp16 package (convert with precision='fp16'); an fp32"
                                 " package's asset computes in fp32")
    resolved = resolve_source(model if path is None else path, None, None, read_model)
    program = resolved.program
    if program is None:
        raise CoreAITranslationError("the model has no MIL program to translate")
    translation = translate_program(program, float_dtype=np.float32 if precision == "fp32" else np.float16)
    metadata = dict(model.user_defined_metadata)
    metadata[COMPUTE_KEY] = precision
    staging = Path(tempfile.mkdtemp(prefix=".rlx_mil_aimodel_", dir=out.parent if out.parent.exists() else None))
    try:
        built = staging / out.name
        translation.builder.save(built, metadata)
        _write_entries(built, translation.entries, str(program.default_function_name or "main"))
        (built / _DESCRIPTION_FILE).write_bytes(_description_only(model.get_spec()).SerializeToString())
        text = _text_folder(path)
        if text is not None:
            shutil.copytree(text, built / TEXT_FOLDER)
        interrupts.check()  # a Ctrl-C a library swallowed: nothing is installed
        if out.exists() or out.is_symlink():
            if not overwrite:  # another save wrote it between our check and now
                raise ExistingFileError(f"{out} exists (pass overwrite=True / --overwrite to replace it)")
            shutil.rmtree(out)
        os.replace(built, out)
        from rlx_mil.coreai.program_check import remember_written

        # only once it is written and in place: opening it needs no child load
        remember_written(out, _read_entries(out)[0])
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return out


def _text_folder(path: Path | None) -> Path | None:
    if path is None:
        return None
    from rlx_mil.coreml.package_items import TEXT_ITEM, item_folder

    return item_folder(path, TEXT_ITEM)


def _description_only(spec: Any) -> Any:
    """The Core ML model spec with its description and nothing else (no program, no weights)."""
    import coremltools as ct

    light = ct.proto.Model_pb2.Model()
    light.specificationVersion = spec.specificationVersion
    light.description.CopyFrom(spec.description)
    return light


def _write_entries(path: Path, entries: Mapping[str, EntryPoint], default: str) -> None:
    def tensors(table: Mapping[str, tuple[tuple[int, ...], np.dtype]]) -> dict[str, Any]:
        return {name: {"shape": list(shape), "dtype": np.dtype(dtype).name} for name, (shape, dtype) in table.items()}

    data = {"default": default, "entries": {
        name: {"inputs": tensors(e.inputs), "outputs": e.outputs, "states": tensors(e.states)} for name, e in entries.items()
    }}
    (path / _ENTRIES_FILE).write_text(json.dumps(data, indent=1))


def _read_entries(path: Path) -> tuple[dict[str, EntryPoint], str]:
    file = path / _ENTRIES_FILE
    if not file.exists():
        raise RlxMilError(f"{path}: not an rlx_mil Core AI asset (no {_ENTRIES_FILE}); rlx_mil runs the assets it wrote")
    data = adapter.read_side_json(file)
    try:
        entries = {}
        for name, e in data["entries"].items():
            entries[name] = EntryPoint(
                name,
                {k: (tuple(v["shape"]), np.dtype(v["dtype"])) for k, v in e["inputs"].items()},
                list(e["outputs"]),
                {k: (tuple(v["shape"]), np.dtype(v["dtype"])) for k, v in e["states"].items()},
            )
            for kind, table in (("input", entries[name].inputs), ("state", entries[name].states)):
                for key, (shape, _) in table.items():
                    if any(not isinstance(d, int) or d < -1 for d in shape) or math.prod(max(d, 1) for d in shape) > MAX_TENSOR_ELEMENTS:
                        raise RlxMilError(f"{file}: {name!r} {kind} {key!r} has shape {list(shape)} (dims -1 or more,"
                                          f" at most {MAX_TENSOR_ELEMENTS:,} elements); write the asset again")
        return entries, str(data["default"])
    except (ValueError, KeyError, TypeError, AttributeError) as err:
        raise RlxMilError(f"{file}: malformed ({type(err).__name__}: {err}); write the asset again") from None


class AssetHandle:
    """What `generate.Session` and `inspect` read of a model, for an asset: its metadata and
    model description (the `MLModel` calls it makes)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        import coremltools as ct

        self.package_path = str(path)
        self.user_defined_metadata = adapter.read_metadata(Path(path))
        self._spec = ct.proto.Model_pb2.Model()
        file = Path(path) / _DESCRIPTION_FILE
        if file.is_file():
            self._spec.ParseFromString(file.read_bytes())

    def get_spec(self) -> Any:
        return self._spec


class AssetProgram:
    """A saved rlx_mil `.aimodel` loaded by Core AI's runtime, run with `CoreAIProgram`'s
    interface (IR names through the stored io names; states as arrays or runtime buffers)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = check_asset(path)
        adapter.require()
        self.entries, self.default_function = _read_entries(self.path)
        self.metadata = adapter.read_metadata(self.path)
        from rlx_mil.coreai.program_check import check_program, program_digest

        check_program(self.path, program_digest(self.path), self.entries)  # the runtime ends a process on a bad one
        self.asset = adapter.LoadedAsset(self.path)

    def new_states(self, function_name: str | None = None) -> dict[str, Any]:
        entry = self._entry(function_name)
        return {name: self.asset.new_state(np.zeros(shape, dtype)) for name, (shape, dtype) in entry.states.items()}

    def _entry(self, function_name: str | None) -> EntryPoint:
        name = function_name or self.default_function
        if name not in self.entries:
            raise MilExecError(f"the asset has no function '{name}' (functions: {sorted(self.entries)})")
        return self.entries[name]

    def run(self, inputs: Mapping[str, Any], *, function_name: str | None = None,
            states: MutableMapping[str, np.ndarray] | None = None, runtime_states: Mapping[str, Any] | None = None,
            io_names: Any = None) -> dict[str, np.ndarray]:
        from rlx_mil.milexec.loader import IONames

        entry = self._entry(function_name)
        names = None
        if io_names is not None:
            names = io_names if isinstance(io_names, IONames) else IONames.from_mapping(io_names)
        else:
            names = IONames.from_metadata(self.metadata)
        to_mil = {ir: mil for mil, ir in (names.inputs.items() if names else ())}
        arrays: dict[str, np.ndarray] = {}
        problems = []
        for key, value in inputs.items():
            mil = key if key in entry.inputs else to_mil.get(key)
            if mil is None or mil not in entry.inputs:
                problems.append(f"unexpected input '{key}' (inputs: {sorted(entry.inputs)})")
                continue
            shape, dtype = entry.inputs[mil]
            array = np.asarray(value)
            if array.ndim == 0 and shape == (1,):
                array = array.reshape(1)
            if len(array.shape) != len(shape) or any(d >= 0 and d != a for a, d in zip(array.shape, shape, strict=False)):
                problems.append(f"input '{key}': shape {list(array.shape)}, expected {list(shape)}")
                continue
            arrays[mil] = array.astype(dtype, copy=False)
        problems += [f"missing input '{m}'" for m in entry.inputs if m not in arrays]
        if problems:
            raise MilExecError("bad inputs for the Core AI asset:\n  - " + "\n  - ".join(problems))
        keep = runtime_states
        if keep is None:
            given = dict(states or {})
            keep = {name: self.asset.new_state(np.asarray(given.get(name, np.zeros(shape, dtype)), dtype))
                    for name, (shape, dtype) in entry.states.items()}
        raw = self.asset.call(entry.name, arrays, keep)
        output_names = names.outputs if names else {}
        result = {output_names.get(key, key): raw[key] for key in entry.outputs}
        if runtime_states is None and states is not None:
            for name, buffer in keep.items():
                states[name] = adapter.LoadedAsset.state_value(buffer)
        return result

    def close(self) -> None:
        self.asset.close()

    def __enter__(self) -> AssetProgram:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_PROGRAM_FILE = "main.mlirb"
_HASH_FILE = "main.hash"


def check_asset(path: str | os.PathLike[str]) -> Path:
    """`path` as a Path if it holds an intact asset: a folder of folders and regular files
    whose program `main.mlirb` is there and matches the SHA-256 Core AI stores beside it in
    `main.hash` (a truncated, replaced or edited program is refused before the runtime reads
    it); a typed error naming the file otherwise."""
    import hashlib

    from rlx_mil.fileio import check_package_tree, open_regular_file

    root = Path(path)
    if not root.is_dir():
        if root.exists():
            raise RlxMilError(f"{root}: a file, not a Core AI asset (an .aimodel is a folder)")
        raise RlxMilError(f"{root}: no such Core AI asset")
    check_package_tree(root, "Core AI asset")
    program = root / _PROGRAM_FILE
    if not program.exists():
        raise RlxMilError(f"{program}: missing; the asset is incomplete, write it again")
    digest = hashlib.sha256()
    stream, _ = open_regular_file(program, "Core AI program")
    with stream:
        for block in iter(lambda: stream.read(1 << 20), b""):
            digest.update(block)
    if (root / "metadata.json").exists() and not isinstance(adapter.read_side_json(root / "metadata.json"), dict):
        raise RlxMilError(f"{root / 'metadata.json'}: not a JSON object; write the asset again")
    stored = root / _HASH_FILE
    if stored.exists():
        want = stored.read_bytes()[:64] if stored.is_file() else b""
        if want != digest.digest():
            raise RlxMilError(f"{program}: its SHA-256 differs from {_HASH_FILE}: the program was truncated or"
                              " edited; write the asset again")
    return root


def asset_summary(path: str | os.PathLike[str]) -> dict[str, Any]:
    """What `rlx-mil inspect` shows of an rlx_mil Core AI asset (read from its files; the
    runtime is not loaded)."""
    root = check_asset(path)
    entries, default = _read_entries(root)
    metadata = adapter.read_metadata(root)

    def tensors(table: Mapping[str, tuple[tuple[int, ...], np.dtype]]) -> list[dict[str, Any]]:
        return [{"name": k, "shape": list(shape), "dtype": np.dtype(dtype).name} for k, (shape, dtype) in table.items()]

    program = root / "main.mlirb"
    import dataclasses

    from rlx_mil.coreml.metadata import ModelSource, PackageMetadataError

    try:
        source = ModelSource.read(metadata)
        model, model_text = (dataclasses.asdict(source), source.to_text()) if source is not None else (None, None)
    except PackageMetadataError as err:  # inspect describes what is there, a damaged record included
        model, model_text = None, f"the 'rlx_mil.source' metadata is malformed ({err})"
    return {
        "path": str(root),
        "format": "Core AI asset (.aimodel)",
        "model": model,
        "model_text": model_text,
        "compute": metadata.get(COMPUTE_KEY, "fp32"),
        "package_precision": metadata.get("rlx_mil.precision"),
        "default_function": default,
        "functions": {name: {"inputs": tensors(e.inputs), "outputs": e.outputs, "states": tensors(e.states)}
                      for name, e in entries.items()},
        "program_bytes": program.stat().st_size if program.is_file() else 0,
        "asset_bytes": sum(f.stat().st_size for f in root.rglob("*") if f.is_file()),
        "metadata_keys": sorted(metadata),
        "text_files": sorted(p.name for p in (root / TEXT_FOLDER).iterdir()) if (root / TEXT_FOLDER).is_dir() else [],
    }


def summary_text(summary: Mapping[str, Any]) -> str:
    from rlx_mil.units import human_bytes

    precision = f" of an {summary['package_precision']} package" if summary.get("package_precision") else ""
    lines = [f"{summary['path']}: {summary['format']}, {summary.get('compute', 'fp32')} compute{precision}, program"
             f" {human_bytes(summary['program_bytes'])} (asset {human_bytes(summary['asset_bytes'])})"]
    if summary.get("model_text"):
        lines.append(f"  model: {summary['model_text']}")
    for name, info in summary["functions"].items():
        inputs = ", ".join(f"{t['name']} {t['dtype']}{t['shape']}" for t in info["inputs"])
        states = ", ".join(f"{t['name']} {t['dtype']}{t['shape']}" for t in info["states"])
        lines.append(f"  {name}: inputs {inputs}; outputs {', '.join(info['outputs'])}" + (f"; states {states}" if states else ""))
    if summary["text_files"]:
        lines.append(f"  text files: {', '.join(summary['text_files'])}")
    return "\n".join(lines)
