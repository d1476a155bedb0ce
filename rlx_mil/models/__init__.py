"""Model builders: Hugging Face checkpoints as RLX graphs (`from_pretrained`), and the
built-in example decoder used by the benchmarks."""

from __future__ import annotations

from rlx_mil.models.pretrained import from_pretrained

__all__ = ["from_pretrained"]
