"""A `@mb.program` saved as an ML Program package, for the executor tests that read saved
packages (constexpr chains as coremltools serialises them)."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def save_program(prog: Any, path: Path, *, target: str = "iOS18", fp16: bool) -> Path:
    """`prog` converted for `target` in fp16 or fp32 compute and saved at `path`."""
    import coremltools as ct

    model = ct.convert(prog, convert_to="mlprogram", minimum_deployment_target=getattr(ct.target, target),
                       compute_precision=ct.precision.FLOAT16 if fp16 else ct.precision.FLOAT32, skip_model_load=True)
    model.save(str(path))
    return path
