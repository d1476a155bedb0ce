"""The 4-bit default of each deployment form.

| form | `compress="4bit"` | `compress="auto4"` chooses from | auto4's default budget |
|---|---|---|---|
| `plain` | per-block int4 (block 32; today's default) | `rlx_mil.compress.auto.CANDIDATES` | 0.30x |
| `gpu` | per-block int4 (block 32): fastest on the GPU, where a 4-bit LUT is 2.3x slower (FluidInference/mobius#81) | int4, uint4-float, int8 (no LUTs) | 0.36x |
| `ane` | `lut4-scaled`: one 4-bit LUT on max-normalised rows and an fp16 scale per output channel (measured: SmolLM2 top-1 0.52 with an int8 head where grouped `lut4` keeps 0.31); per-block ints run on the GPU/CPU only (coremltools #2510) | lut4-group4, lut4-group1 (a table per 4 rows / per row: on iOS18, which stores a scaled table per row anyway, no more bytes than lut4-scaled), lut4-scaled, lut6, lut6-scaled, int8 per channel (no per-block ints); lut3-scaled and lut3-group1 too with measured sensitivities; tables and codes fitted to the calibration text (`fit=on`: activation-weighted, GPTQ-rounded, the table refitted to the codes), the plan measuring them on calibration tokens the fit did not use | 0.40x |

An explicit scheme (`int4`, `lut4-group8`, ...) is always what it says, and so is an explicit
budget (`auto4;budget=0.3`, `--compress-budget`). The forms' default budgets are measured
(docs/compression.md, "Devices"): on SmolLM2-135M-Instruct the GPU's 0.36x holds its Q4_1
layers exactly (`uint4-float`, 0.3125x of their fp16 bytes) with an 8-bit tied embedding / head
(teacher-forced top-1 0.975, perplexity x1.003 on held-out text), where 0.30x cannot. The
Neural Engine's per-channel palettes cannot hold those per-block grids; GPTQ-style rounding
halves what its `lut4-scaled` layers cost the model (SmolLM2, int8 head: mean KL 0.52 -> 0.26,
top-1 0.60 -> 0.72; docs/compression.md); with tables per row among its candidates and codes
fitted on 640 calibration tokens its `auto4` keeps top-1 0.916, KL 0.023, perplexity x1.037 at
0.400x, where with one scaled table as its only 4-bit palette it kept 0.887, KL 0.043, x1.042
(docs/compression.md, "Per device on SmolLM2-135M-Instruct").
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from typing import Any

from rlx_mil.coreml.deploy.forms import DeployForm

#: `compress="4bit"` per form.
FOUR_BIT: dict[DeployForm, str] = {DeployForm.PLAIN: "int4", DeployForm.GPU: "int4", DeployForm.ANE: "lut4-scaled"}
#: `auto4` per form: the scheme every weight starts from, the candidates (cheapest first) and
#: the default size budget (a fraction of the fp16 weight bytes; module doc).
AUTO4: dict[DeployForm, tuple[str, tuple[str, ...], float]] = {
    DeployForm.GPU: ("int4", ("int4", "uint4-float", "int8"), 0.36),
    DeployForm.ANE: ("lut4-scaled", ("lut4-group4", "lut4-group1", "lut4-scaled", "lut6", "lut6-scaled", "int8"), 0.40),
}
#: With measured sensitivities, `auto4` per form may also take these (narrower than its start)
#: for the weights the outputs hardly feel.
AUTO4_NARROWER: dict[DeployForm, tuple[str, ...]] = {DeployForm.ANE: ("lut3-scaled", "lut3-group1")}
#: `auto4`'s codes per form when the config does not say (`fit=`, `rlx_mil.compress.fitting`):
#: the Neural Engine's per-channel palettes cannot hold a per-block grid, so their codes are
#: fitted to the calibration text: activation-weighted tables, codes rounded with error
#: compensation (module doc).
AUTO4_FIT: dict[DeployForm, str] = {DeployForm.ANE: "on"}
_FOUR_BIT = re.compile(r"^\s*4-?bit\s*$", re.IGNORECASE)


def _four_bit(value: Any, form: DeployForm) -> Any:
    return FOUR_BIT[form] if isinstance(value, str) and _FOUR_BIT.match(value) else value


def four_bit_text(spec: str, form: DeployForm) -> str:
    """A `--compress` text with every `4bit` scheme (default or `key=4bit`) as `form`'s."""
    items = []
    for item in spec.split(";"):
        key, eq, value = item.rpartition("=")
        items.append(f"{key}{eq}{_four_bit(value, form)}" if eq else _four_bit(item, form))
    return ";".join(items)


def form_compression(compress: Any, form: DeployForm) -> Any:
    """`compress` (any form `convert` takes) with `4bit` and `auto4` meaning `form`'s; other
    values are returned unchanged."""
    from rlx_mil.compress import CompressionConfig, parse_compress, parse_scheme

    if isinstance(compress, str):
        compress = four_bit_text(compress, form)
    elif isinstance(compress, Mapping) and not isinstance(compress, CompressionConfig):
        compress = {k: ([(p, _four_bit(s, form)) for p, s in v] if k == "rules" and not isinstance(v, Mapping)
                        else _four_bit(v, form)) for k, v in compress.items()}
    if form not in AUTO4 or compress is None:
        return compress
    config = parse_compress(compress)
    if config is None or config.auto != 4 or config.candidates is not None:
        return config
    start, candidates, budget = AUTO4[form]
    if config.budget is None and config.max_error is None:
        config = dataclasses.replace(config, budget=budget)
    return dataclasses.replace(config, default=parse_scheme(start), candidates=candidates,
                               narrower=AUTO4_NARROWER.get(form, ()),
                               fit=AUTO4_FIT.get(form) if config.fit is None else config.fit)
