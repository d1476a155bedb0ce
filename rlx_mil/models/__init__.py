"""Model builders: Hugging Face checkpoints (`from_pretrained`) and GGUF files (`from_gguf`)
as RLX graphs, and the
built-in example decoder used by the benchmarks."""

from __future__ import annotations

from rlx_mil.models.gguf import from_gguf
from rlx_mil.models.pretrained import from_pretrained

__all__ = ["from_gguf", "from_pretrained"]
