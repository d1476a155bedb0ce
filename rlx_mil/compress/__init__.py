"""Weight compression during conversion: linear int8/int4 and k-means palettized weights.

`rlx_mil.convert(graph, params, compress="int4")` compresses each selected weight at the moment
the lowering turns it into a constant, straight from the given array (memory-mapped and
bfloat16 arrays included), so no float copy of the model is ever held. See docs/compression.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rlx_mil.compress.calibration import load_calibration, output_errors
from rlx_mil.compress.plan import DequantizedParams, WeightCompressor, param_roles
from rlx_mil.compress.report import CompressionReport, WeightReport, report_of, worst_weights
from rlx_mil.compress.schemes import (
    PRESETS,
    CompressionConfig,
    LinearScheme,
    PaletteScheme,
    Rule,
    parse_compress,
    parse_scheme,
)
from rlx_mil.errors import CompressionError

__all__ = [
    "PRESETS",
    "CompressionConfig",
    "CompressionError",
    "CompressionReport",
    "DequantizedParams",
    "LinearScheme",
    "PaletteScheme",
    "Rule",
    "WeightCompressor",
    "WeightReport",
    "dequantized_params",
    "load_calibration",
    "measure_output_error",
    "param_roles",
    "parse_compress",
    "parse_scheme",
    "report_of",
]


def dequantized_params(params: Mapping[str, Any], model_or_report: Any, codes: Mapping[str, Any] | None = None,
                       remember: dict[str, Any] | None = None) -> DequantizedParams:
    """`params` as the compressed model sees them: each compressed weight dequantized (on
    access, one at a time), the others unchanged. Evaluating the reference with these makes
    verification of a compressed package exact. `codes` (a conversion's own, e.g. the
    `rlx_mil_codes` a multifunction model carries) are decoded instead of encoding again;
    without them, weights encoded here are kept in `remember` (when given) for the next
    call with the same dict."""
    report = model_or_report if isinstance(model_or_report, CompressionReport) else report_of(model_or_report)
    if report is None:
        raise CompressionError("the model carries no compression report (was it converted with compress=...?)")
    return DequantizedParams(params, report, codes, remember)


def measure_output_error(
    model: Any,
    uncompressed: Any,
    inputs: Mapping[str, Any],
) -> dict[str, dict[str, float]]:
    """Run the compressed `model` and the `uncompressed` conversion of the same graph through
    the NumPy MIL executor on `inputs`; record per output the max |error| and relative L2 error
    in the model's compression report (metadata included) and return them."""
    from rlx_mil import milexec

    report = report_of(model)
    if report is None:
        raise CompressionError("measure_output_error takes a model converted with compress=...")
    from rlx_mil.compress.quality_check import judge_outputs, warn_below_threshold

    got, want = milexec.run(model, inputs), milexec.run(uncompressed, inputs)
    errors = output_errors(got, want)
    report.output_error = errors
    check = judge_outputs(want, got, inputs, compared_with="the uncompressed conversion (MIL executor)",
                          inputs_label="the --compress-check inputs", worst=worst_weights(report))
    report.quality = check.to_dict()
    warn_below_threshold(check)
    from rlx_mil.compress.report import METADATA_KEY

    model.user_defined_metadata[METADATA_KEY] = report.to_json()
    return errors
