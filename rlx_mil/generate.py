"""`rlx_mil.generate`: the public name of `rlx_mil.llm.generate` (token generation with a stateful
LLM package), kept so `from rlx_mil.generate import Session` reads as the docs say."""

from rlx_mil.llm.generate import FunctionInfo, GenerationError, Session, pick_token

__all__ = ["FunctionInfo", "GenerationError", "Session", "pick_token"]
