"""GGUF (llama.cpp) model files as RLX graphs: `from_gguf` reads the metadata into the
builders' model description and the tensors under the builders' weight names."""

from __future__ import annotations

from rlx_mil.models.gguf.loader import from_gguf

__all__ = ["from_gguf"]
