"""The KV-cache capacity of the Neural Engine form.

A Core ML state whose dims are not multiples of 32 fails on the Neural Engine (coremltools
#2631). Of a KV cache's dims `[.., H_kv, C, D]` the capacity `C` is the one the conversion
chooses (`max_context`); `deploy="ane"` rounds it up to the next multiple of 32, and the
package's LLM contract (`max_context`), its `cache_position` range and `Session` all use the
rounded capacity: the cache really holds that many tokens. The head size `D` and the dims of
recurrent states (convolution windows, gated delta-net states) are the model's own and are
kept; `rlx_mil.preflight` reports the ones that are not multiples of 32.
"""

from __future__ import annotations

from typing import Any

from rlx_mil.lowering.state.kv_cache import NEURAL_ENGINE_MULTIPLE


def neural_engine_capacity(max_context: Any) -> Any:
    """`max_context` rounded up to a multiple of 32 (anything but a positive int is returned
    as is, for the option checks to refuse it)."""
    if isinstance(max_context, bool) or not isinstance(max_context, int) or max_context < 1:
        return max_context
    return -(-max_context // NEURAL_ENGINE_MULTIPLE) * NEURAL_ENGINE_MULTIPLE
