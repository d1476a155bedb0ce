"""What a generation took: prompt feeding and the new tokens, as `generate` and `chat` print it."""

from __future__ import annotations

from dataclasses import dataclass

from rlx_mil.units import counted


@dataclass
class GenerationStats:
    """Counts and times of the last generation: prompt feeding and the new tokens."""

    prompt_tokens: int = 0
    prompt_seconds: float = 0.0
    new_tokens: int = 0
    seconds: float = 0.0
    stopped: str = "max tokens"
    #: The prompt was fed whole (False: not started, or stopped while it was being fed).
    prompt_read: bool = False

    def to_text(self) -> str:
        def rate(n: int, t: float) -> str:
            return f"{n / t:.1f} tok/s" if t > 0 and n else "- tok/s"

        if not self.prompt_read:  # an unfinished stage has no rate and no generation to report
            if not self.prompt_tokens:
                return f"prompt: not read; stopped: {self.stopped}"
            return f"prompt: {counted(self.prompt_tokens, 'token')}, not all fed ({self.prompt_seconds:.2f} s); stopped: {self.stopped}"
        return (f"prompt: {counted(self.prompt_tokens, 'token')} in {self.prompt_seconds:.2f} s"
                f" ({rate(self.prompt_tokens, self.prompt_seconds)}); generation: {counted(self.new_tokens, 'token')} in"
                f" {self.seconds:.2f} s ({rate(self.new_tokens, self.seconds)}); stopped: {self.stopped}")
