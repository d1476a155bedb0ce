"""Helpers shared by the milexec tests: building Functions from feeds, converting, cleanup."""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np


def mil_dtype(array: np.ndarray) -> Any:
    from coremltools.converters.mil.mil import types

    return {
        np.dtype(np.float32): types.fp32,
        np.dtype(np.float16): types.fp16,
        np.dtype(np.int32): types.int32,
        np.dtype(np.int8): types.int8,
        np.dtype(np.uint8): types.uint8,
        np.dtype(np.bool_): types.bool,
    }[np.asarray(array).dtype]


def build_function(
    feeds: dict[str, np.ndarray], build: Callable[[dict[str, Any]], list[Any]], opset: str = "iOS18"
) -> Any:
    """A MIL Function with one placeholder per feed (named after the key) and `build`'s outputs."""
    import coremltools as ct
    from coremltools.converters.mil import Builder as mb
    from coremltools.converters.mil.mil import Function

    placeholders = {
        name: mb.placeholder(shape=np.asarray(value).shape, dtype=mil_dtype(value), name=name)
        for name, value in feeds.items()
    }
    with Function(placeholders, opset_version=getattr(ct.target, opset)) as fn:
        outputs = build(dict(fn.inputs))
        fn.set_outputs(list(outputs))
    return fn


def build_program(
    feeds: dict[str, np.ndarray], build: Callable[[dict[str, Any]], list[Any]], opset: str = "iOS18"
) -> Any:
    from coremltools.converters.mil.mil import Program

    program = Program()
    program.add_function("main", build_function(feeds, build, opset))
    return program


@contextmanager
def converted(
    program: Any, tmp_path: Path, *, opset: str = "iOS18", fp16: bool = False, name: str = "model"
) -> Iterator[Any]:
    """ct.convert `program` into tmp_path/<name>.mlpackage; removes the package afterwards."""
    import coremltools as ct

    from rlx_mil.api import objects_frozen
    from rlx_mil.coreml.pipeline import validation_once_per_pipeline

    package = tmp_path / f"{name}.mlpackage"
    # as rlx_mil.convert: ct.convert's closing gc.collect() sees only the conversion's objects,
    # and the program is validated per pipeline rather than after every pass
    with objects_frozen(), validation_once_per_pipeline():
        model = ct.convert(
            program,
            convert_to="mlprogram",
            minimum_deployment_target=getattr(ct.target, opset),
            compute_precision=ct.precision.FLOAT16 if fp16 else ct.precision.FLOAT32,
            skip_model_load=True,
            package_dir=str(package),
        )
    try:
        yield model
    finally:
        shutil.rmtree(package, ignore_errors=True)


def unprepared_logits(path: Path, calls: list[tuple[str, list[int], int]]) -> list[np.ndarray]:
    """Each call through `milexec.run` keeping every value (no plan: nothing freed or in place)."""
    from rlx_mil import milexec

    program = milexec.load_program(path)
    states: dict[str, np.ndarray] = {}
    logits = []
    for function, tokens, position in calls:
        feeds = {"input_ids": np.array([tokens], np.int32),
                 "position_ids": np.arange(position, position + len(tokens), dtype=np.int32)[None],
                 "cache_position": np.array([position], np.int32)}
        out = milexec.run(program, feeds, function_name=function, states=states, return_all=True).outputs
        array = out["logits"] if "logits" in out else next(iter(out.values()))
        logits.append(array.reshape(-1, array.shape[-1])[-1])
    return logits
