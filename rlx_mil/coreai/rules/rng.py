"""MIL's random ops: Core AI has no random number generation, so programs holding them cannot
be translated (listed in the coverage doc with this reason)."""

from __future__ import annotations

from rlx_mil.coreai.registry import inexpressible

for _op_type in ("random_normal", "random_uniform", "random_categorical", "random_bernoulli"):
    inexpressible(_op_type, "Core AI has no random-number ops")
