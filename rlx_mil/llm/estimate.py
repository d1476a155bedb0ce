"""How fast can a decode step be at best? The bytes one token streams from memory, and the
tokens/s that allows on each Apple chip's memory bandwidth (`rlx-mil inspect --estimate`,
docs/deploying.md).

Decoding one token reads every weight of the decode function once (in the form it is stored:
compressed weights stream compressed) plus the KV cache up to the context and every recurrent
state; nothing is cached between tokens on chip at these sizes. A token can therefore take no
less than bytes / bandwidth seconds: `bandwidth / bytes` is an **upper bound** on tokens/s,
never a prediction (real decode reaches a fraction of it: Apple's 8B int4 example streams about
141 GB/s on a 400 GB/s M1 Max). Counted per decode call:

* weights: every `const` the function reads (the storage of `constexpr_*` ops at its stored
  size), except tables read only by `gather` (embedding lookups), of which one row is counted;
* KV cache: each state with a `max_context`-long axis (rlx_mil's contract) at `context` slots
  read plus one written; other states (recurrent ones) read and written in full. A package
  without rlx_mil's contract has its states counted read once in full.

Mixture-of-experts decoders read only their routed experts per token; counting every expert
makes their bound low (conservative), which the text says.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlx_mil.coreml.metadata import LLMContract, PackageMetadataError
from rlx_mil.coreml.package_info import open_model
from rlx_mil.coreml.preflight import _Function, _tensor
from rlx_mil.errors import InvalidOptionError, RlxMilError
from rlx_mil.units import human_bytes


@dataclass(frozen=True)
class Chip:
    """A chip's unified-memory bandwidth (GB/s = 10^9 bytes/s) and where the figure comes from."""

    name: str
    bandwidth_gbs: float
    source: str


_MAC_2021 = "Apple newsroom, 'Introducing M1 Pro and M1 Max' (2021-10-18)"
_M2_PRO = "Apple newsroom, 'Apple unveils M2 Pro and M2 Max' (2023-01-17)"
_M3 = "Apple, MacBook Pro (14-inch, M3, Nov 2023) technical specifications"
_M4_PRO = "Apple newsroom, 'Apple introduces M4 Pro and M4 Max' (2024-10-30)"

#: Memory bandwidth of Apple's chips (docs/deploying.md has the same table).
CHIPS: tuple[Chip, ...] = (
    Chip("M1", 68.25, "LPDDR4X-4266 on a 128-bit bus; Apple gives no figure (its M1 Pro release calls 200 GB/s"
         " 'nearly 3x M1')"),
    Chip("M1 Pro", 200, _MAC_2021),
    Chip("M1 Max", 400, _MAC_2021),
    Chip("M1 Ultra", 800, "Apple newsroom, 'Apple unveils M1 Ultra' (2022-03-08)"),
    Chip("M2", 100, "Apple newsroom, 'Apple unveils M2' (2022-06-06)"),
    Chip("M2 Pro", 200, _M2_PRO),
    Chip("M2 Max", 400, _M2_PRO),
    Chip("M2 Ultra", 800, "Apple newsroom, 'Apple introduces M2 Ultra' (2023-06-05)"),
    Chip("M3", 100, _M3),
    Chip("M3 Pro", 150, _M3),
    Chip("M3 Max (14-core CPU)", 300, _M3),
    Chip("M3 Max (16-core CPU)", 400, _M3),
    Chip("M3 Ultra", 819, "Apple newsroom, 'Apple reveals M3 Ultra' (2025-03-05)"),
    Chip("M4", 120, "Apple newsroom, 'Apple introduces M4 chip' (2024-05-07)"),
    Chip("M4 Pro", 273, _M4_PRO),
    Chip("M4 Max (14-core CPU)", 410, _M4_PRO),
    Chip("M4 Max (16-core CPU)", 546, _M4_PRO),
    Chip("A17 Pro", 51.2, "LPDDR5-6400 on a 64-bit bus (iPhone 15 Pro); Apple gives no figure"),
    Chip("A18", 60, "LPDDR5X-7500 on a 64-bit bus (iPhone 16); Apple gives no figure"),
    Chip("A18 Pro", 60, "LPDDR5X-7500 on a 64-bit bus (iPhone 16 Pro); Apple gives no figure"),
)

#: Bits per element of MIL's `DataType` values (coremltools' MIL.proto).
_BITS = {1: 8, 10: 16, 11: 32, 12: 64, 13: 16, 21: 8, 22: 16, 23: 32, 24: 64, 25: 4, 31: 8, 32: 16, 33: 32,
         34: 64, 35: 4, 36: 2, 37: 1, 38: 6, 39: 3, 40: 8, 41: 8}


@dataclass
class DecodeEstimate:
    """The bytes one decode call streams (summed over the chunks of a chunked set)."""

    source: str
    functions: list[str]
    weight_bytes: int = 0
    lookup_bytes: int = 0
    state_bytes: int = 0
    context: int | None = None
    max_context: int | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def bytes_per_token(self) -> int:
        return self.weight_bytes + self.lookup_bytes + self.state_bytes

    def bounds(self, chips: Sequence[Chip] = CHIPS) -> list[tuple[Chip, float]]:
        """(chip, tokens/s upper bound) for each chip."""
        per_token = max(self.bytes_per_token, 1)
        return [(chip, chip.bandwidth_gbs * 1e9 / per_token) for chip in chips]

    def to_dict(self) -> dict[str, Any]:
        return {
            "source": self.source, "functions": self.functions, "weight_bytes": self.weight_bytes,
            "lookup_bytes": self.lookup_bytes, "state_bytes": self.state_bytes, "context": self.context,
            "max_context": self.max_context, "bytes_per_token": self.bytes_per_token, "notes": self.notes,
            "upper_bound_tokens_per_s": [
                {"chip": c.name, "bandwidth_gbs": c.bandwidth_gbs, "tokens_per_s": round(t, 2), "source": c.source}
                for c, t in self.bounds()
            ],
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    def to_text(self) -> str:
        context = f" at context {self.context} of {self.max_context}" if self.context is not None else ""
        lines = [
            f"decode estimate for {self.source} (functions {', '.join(self.functions)}):",
            f"  weights read per token:        {human_bytes(self.weight_bytes)} ({self.weight_bytes:,} bytes)",
            f"  embedding rows per token:      {human_bytes(self.lookup_bytes)}",
            f"  KV cache / state traffic{context}: {human_bytes(self.state_bytes)}",
            f"  total streamed per token:      {human_bytes(self.bytes_per_token)}",
            "  UPPER BOUND on decode tokens/s (bytes per token / memory bandwidth; real decode reaches a fraction):",
        ]
        width = max(len(c.name) for c in CHIPS)
        lines += [f"    {c.name:<{width}}  {c.bandwidth_gbs:>7.2f} GB/s  <= {t:,.1f} tok/s" for c, t in self.bounds()]
        lines += [f"  note: {n}" for n in self.notes]
        lines.append("  bandwidth sources: docs/deploying.md (or --json)")
        return "\n".join(lines)


def _bytes(t: Any) -> int:
    if t is None or any(d is None for d in t.dims):
        return 0
    count = 1
    for d in t.dims:
        count *= int(d)
    return (count * _BITS.get(t.dtype, 32) + 7) // 8


def _feeds_only_lookups(f: _Function, var: str) -> bool:
    """`var` is read only by constexpr ops whose outputs are embedding tables (or feed only
    such ops in turn): storage of a table of which one row a token is counted."""
    uses = f.consumers.get(var, [])
    return bool(uses) and all(
        u.type.startswith("constexpr_") and all(f.gather_table(o.name) or _feeds_only_lookups(f, o.name) for o in u.outputs)
        for u, _ in uses
    )


def _decode_function(contract: LLMContract | None, spec: Any) -> str:
    if contract is not None and contract.functions:
        ones = [name for name, f in contract.functions.items() if f.query_len == 1]
        if ones:
            return ones[0]
    return spec.description.defaultFunctionName or next(iter(spec.mlProgram.functions), "main")


def _add_package(estimate: DecodeEstimate, model_or_path: Any, context: int | None, contract: LLMContract | None) -> None:
    model, path = open_model(model_or_path)
    spec = model.get_spec()
    if spec.WhichOneof("Type") != "mlProgram":
        raise RlxMilError(f"{path or 'model'}: not an ML Program; --estimate reads ML Programs")
    try:
        own = LLMContract.read(dict(model.user_defined_metadata))
    except PackageMetadataError as err:
        raise RlxMilError(f"{path}: {err}") from None
    contract = own or contract
    name = _decode_function(contract, spec)
    if name not in spec.mlProgram.functions:
        raise RlxMilError(f"{path}: no function {name!r} in the program")
    f = _Function(name, spec.mlProgram.functions[name])
    estimate.functions.append(f"{Path(path).name}:{name}" if path else name)
    for op in f.ops:
        if op.type != "const" and not op.type.startswith("constexpr_"):
            continue
        for out in op.outputs:
            var = out.name
            if op.type.startswith("constexpr_"):
                if f.gather_table(var):
                    t = f.types.get(var)
                    estimate.lookup_bytes += _bytes(t) // max(int(t.dims[0] or 1), 1) if t and t.dims else 0
                elif not _feeds_only_lookups(f, var):
                    # A saved package holds a constexpr op's storage inline (named consts are
                    # counted as consts above).
                    estimate.weight_bytes += sum(
                        _bytes(_tensor(binding.value.type))
                        for arg in op.inputs.values() for binding in arg.arguments if not binding.name
                    )
                continue
            uses = f.consumers.get(var, [])
            if f.gather_table(var):
                t = f.types.get(var)
                estimate.lookup_bytes += _bytes(t) // max(int(t.dims[0] or 1), 1) if t and t.dims else 0
            elif uses and all(u.type.startswith("constexpr_") and all(f.gather_table(o.name) for o in u.outputs)
                              for u, _ in uses):
                continue  # storage of a compressed embedding table: one row is counted above
            else:
                estimate.weight_bytes += _bytes(f.types.get(var))
    capacity = contract.max_context if contract is not None else None
    estimate.max_context = capacity
    at = capacity if context is None else context
    if capacity is not None:
        estimate.context = at
    for _state, t in f.states:
        total = _bytes(t)
        if own is None and contract is None:
            estimate.state_bytes += total
        elif capacity is not None and capacity in t.dims:
            estimate.state_bytes += total * (min(at or capacity, capacity) + 1) // capacity
        else:
            estimate.state_bytes += 2 * total


def estimate_decode(path: str | Path, context: int | None = None) -> DecodeEstimate:
    """The decode estimate of a `.mlpackage` or a chunked set's folder at `context` tokens in the
    cache (default: the package's `max_context`)."""
    from rlx_mil.llm.chunked import is_chunked_set, read_chunked_set

    if context is not None and (isinstance(context, bool) or not isinstance(context, int) or context < 1):
        raise InvalidOptionError(f"context must be an int >= 1, got {context!r}")
    estimate = DecodeEstimate(str(path), [])
    if is_chunked_set(path):
        chunked = read_chunked_set(path)
        if context is not None and chunked.contract.max_context is not None and context > chunked.contract.max_context:
            raise InvalidOptionError(f"context {context} exceeds the set's max_context {chunked.contract.max_context}")
        for i in range(len(chunked.chunks)):
            _add_package(estimate, chunked.package(i), context, chunked.contract)
        estimate.max_context = chunked.contract.max_context
        estimate.context = context or chunked.contract.max_context
    else:
        _add_package(estimate, path, context, None)
        if context is not None and estimate.max_context is not None and context > estimate.max_context:
            raise InvalidOptionError(f"context {context} exceeds the package's max_context {estimate.max_context}")
    if not _known_dense(path):
        estimate.notes.append("mixture-of-experts models read only their routed experts per token; every expert is"
                              " counted here, so their bound is conservative")
    return estimate


#: config.json keys giving a mixture-of-experts model's expert count (Qwen3-MoE / Mixtral,
#: GPT-OSS / DeepSeek / others).
_EXPERT_KEYS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts")


def _known_dense(path: str | Path) -> bool:
    """True when the config.json the package carries says the model has no experts (the note on
    mixture-of-experts bounds is then noise); False when it has some or there is no config."""
    from rlx_mil.llm.package_files import tokenizer_folder

    try:
        folder = tokenizer_folder(path)
        config = json.loads((folder / "config.json").read_text()) if folder and (folder / "config.json").is_file() else None
    except (OSError, ValueError, RlxMilError):
        return False
    if not isinstance(config, dict):
        return False
    parts = [config, *(v for v in config.values() if isinstance(v, dict))]  # text_config and the like
    return not any(isinstance(part.get(k), int) and part.get(k, 0) > 1 for part in parts for k in _EXPERT_KEYS)
