"""A Hugging Face checkpoint folder -> a saved `.mlpackage`, each stage reported on a
`Progress` (what `rlx-mil convert-hf` runs; its flags live in `rlx_mil.cli.convert_hf`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from rlx_mil.coreml.saving import sweep_killed_saves
from rlx_mil.errors import InvalidOptionError
from rlx_mil.ir import Graph
from rlx_mil.progress import CountingParams, Progress
from rlx_mil.units import counted, human_bytes

VARIANTS = ("prefill", "decode")


def check_output(output: Path, overwrite: bool) -> None:
    """Refuse a bad output path before any work, after sweeping the staging folders of
    killed saves to it (a conversion that then fails must not leave them behind)."""
    if output.suffix not in (".mlpackage", ".aimodel"):
        raise InvalidOptionError(f"the output is a .mlpackage folder (or a Core AI .aimodel asset), got {str(output)!r}")
    sweep_killed_saves(output)
    if output.exists() and not overwrite:
        raise InvalidOptionError(f"{output} exists; pass --overwrite to replace it")


def convert_checkpoint(
    model_dir: str | Path,
    output: str | Path,
    *,
    build: Mapping[str, Any],
    convert: Mapping[str, Any],
    progress: Progress,
    overwrite: bool = False,
    save_graph: Path | None = None,
    description: Mapping[str, str | None] | None = None,
    check_inputs: Mapping[str, np.ndarray] | None = None,
    loader: Callable[..., tuple[Graph, Mapping[str, Any]]] | None = None,
    prepare: Callable[[Any, Any, Mapping[str, str | None] | None], Any] | None = None,
    format: str | None = None,
) -> tuple[Graph, Mapping[str, Any], Path]:
    """from_pretrained -> rlx_mil.convert -> rlx_mil.save, each stage reported on `progress`.
    The package carries the checkpoint's tokenizer files and model description
    (`rlx_mil.llm.package_files`; `description` overrides its fields). With `check_inputs` and
    compression, the uncompressed conversion's output error on them is recorded too.
    `loader` (default `from_pretrained`) reads `model_dir` with the `build` options and
    `prepare(model, model_dir, description)` (default `prepare_package`) adds the text side
    (`from_gguf` and its package preparation for a GGUF file).
    `format` ("mlpackage" or "aimodel", Apple's Core AI asset; default: `output`'s suffix) as
    for `rlx_mil.save`. Returns the graph, its params and the package (or asset) path."""
    from rlx_mil import api
    from rlx_mil.coreml.output_format import check_format, output_path
    from rlx_mil.coreml.patches import passes_shown_on
    from rlx_mil.models.pretrained import from_pretrained

    out = output_path(output, format)
    if check_format(format) == "aimodel":
        from rlx_mil.coreai import require

        require("format='aimodel'")
    check_output(out, overwrite)
    progress.begin("reading the checkpoint")
    graph, params = (loader or from_pretrained)(model_dir, **build)
    progress.end(f"{graph.name}: {counted(len(graph), 'IR node')}, {counted(len(params), 'param')}")
    if save_graph is not None:
        graph.to_json_file(save_graph)
        progress.note(f"  wrote the graph to {save_graph}")

    total = len(params)
    seen: set[str] = set()
    loaded = [0]

    def on_read(name: str, value: np.ndarray) -> None:
        if not seen:
            progress.begin("loading weights", total=total, unit=" tensors")
        if name in seen:
            return
        seen.add(name)
        loaded[0] += int(np.asarray(value).nbytes)
        progress.advance()
        if len(seen) == total:
            progress.end(f"{counted(total, 'tensor')}, {human_bytes(loaded[0])}")
            progress.begin("building the MIL program", unit=" ops")

    progress.begin("loading coremltools")
    import coremltools  # noqa: F401  (its import takes seconds; shown as its own stage)

    progress.end()
    with passes_shown_on(progress):
        model = api.convert(graph, CountingParams(params, on_read), **convert)
    if check_inputs is not None and convert.get("compress"):
        from rlx_mil.compress import measure_output_error

        progress.begin("converting without compression for --compress-check")
        uncompressed = api.convert(graph, params, **{**convert, "compress": None})
        progress.end()
        progress.begin("measuring the compression's output error")
        measure_output_error(model, uncompressed, check_inputs)
        del uncompressed
        progress.end()
    from rlx_mil.llm.package_files import prepare_package

    (prepare or prepare_package)(model, model_dir, description)
    progress.begin("writing the package")
    path = api.save(model, out, overwrite=overwrite, format=format)
    progress.end(str(path))
    return graph, params, path
