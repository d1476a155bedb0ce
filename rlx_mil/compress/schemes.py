"""Compression schemes and the configuration that picks one per weight.

The vocabulary follows coremltools' `OpLinearQuantizerConfig` (mode ``linear_symmetric`` /
``linear``, dtype int8/uint8/int4/uint4, granularity per_tensor / per_channel / per_block with
``block_size``) and `OpPalettizerConfig` (k-means LUT of ``nbits``, granularity per_tensor /
per_grouped_channel with ``group_size``), so a scheme here means the same numbers there.

Text form (the CLI's ``--compress`` and ``convert(compress="...")``)::

    SCHEME                      int8 | uint8 | int4 | uint4 | lut1..lut8 | none
      modifiers joined by '-':  sym | asym | float | tensor | channel | block | blockN | groupN | scaled
      e.g. int4 (= int4-sym-block32), int8 (= int8-sym-channel), int8-asym-tensor,
           int4-block64, uint4-float (= uint4 codes, float offset, block 32: llama.cpp's Q4_1 grid),
           lut4 (= lut4-group16: a table per 16 output channels), lut4-tensor, lut4-group4, lut6,
           lut4-scaled (one table on rows divided by their largest |w|, an fp16 scale per row),
           lut4-scaled+r4 (any scheme +rN: a rank-N correction of its error, rlx_mil.compress.lowrank),
           4bit (the deployment form's 4-bit default: int4 per block; lut4-scaled with deploy="ane")
    CONFIG                      items separated by ';'
      SCHEME                    the default for every eligible weight
      embeddings=SCHEME         tables read by Gather (token embeddings)
      lm_head=SCHEME            the output projection (producing a graph output)
      min_size=N                weights with fewer elements stay in float (default 2048)
      auto4 (auto3, auto6, auto8) a per-weight mix chosen from error statistics (rlx_mil.compress.auto)
      budget=F, max_error=E     with autoN: size fraction of fp16 / largest estimated weight error
      max_kl=K, min_top1=T      the quality target: the quality check's thresholds for this conversion
      check=off                 skip the output check on generated inputs (done when no calibration is given
                                and the weights as float32 fit in CHECK_AUTO_LIMIT; check=on: whatever the size)
      glob:PATTERN=SCHEME       weights whose name matches the glob (first matching rule wins)
      re:PATTERN=SCHEME         weights whose name matches the regular expression (re.search)
      e.g. "lut4;embeddings=int8;lm_head=lut6;re:\\.v_proj\\.=int8;min_size=4096"

Rules beat everything else: they may compress norms, biases or RoPE tables (which are never
compressed otherwise) and weights below `min_size`, or keep a weight in float (``=none``).
"""

from __future__ import annotations

import dataclasses
import difflib
import fnmatch
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rlx_mil.compress.quality import DEFAULT_THRESHOLDS, QualityThresholds, check_target
from rlx_mil.compress.scheme_words import Modifiers, check_rank, rank_suffix, split_rank
from rlx_mil.errors import InvalidOptionError
from rlx_mil.units import counted

PER_TENSOR = "per_tensor"
PER_CHANNEL = "per_channel"
PER_BLOCK = "per_block"
PER_GROUPED_CHANNEL = "per_grouped_channel"

#: Index widths `constexpr_lut_to_dense` has (iOS18: uint1/2/3/4/6/8; iOS16: 1/2/4/6/8).
PALETTE_BITS = (1, 2, 3, 4, 6, 8)
DEFAULT_BLOCK_SIZE = 32
#: `lutN` without a modifier: one table per this many output channels (measured on trained
#: checkpoints, docs/compression.md); `lutN-tensor` is one table per weight.
DEFAULT_GROUP_SIZE = 16
DEFAULT_MIN_SIZE = 2048
#: The conversion-time output check runs by default while the graph's weights as float32 take
#: at most this many bytes (a 256M-parameter model): it holds them whole, as read and decoded.
CHECK_AUTO_LIMIT = 2**30
#: `fit=`: how codes use the calibration activations (`rlx_mil.compress.fitting`): not at all,
#: activation-weighted tables, error-compensating (GPTQ-style) rounding, or both; `MODE,ORDER`
#: fits each weight to the activations the already-encoded weights before it give (`sequential`)
#: or to the float model's (`float`); unsaid, `FIT_ORDER` (`rlx_mil.compress.sequential`;
#: measured on SmolLM2's Neural Engine auto4, docs/compression.md).
FIT_MODES = ("off", "weighted", "gptq", "on")
FIT_ORDERS = ("sequential", "float")
FIT_ORDER = "float"


@dataclass(frozen=True)
class LinearScheme:
    """Affine integer codes: w ~= scale * (q - offset), scale/offset shared per tensor, per
    output channel or per block of `block_size` input elements of one output channel."""

    bits: int = 8
    signed: bool = True
    symmetric: bool = True
    granularity: str = PER_CHANNEL
    block_size: int = DEFAULT_BLOCK_SIZE
    #: Asymmetric only: the offset is a float (`w ~= scale * (q - offset)` with the block's own
    #: [min, max] mapped onto the codes, zero need not be representable), as iOS18's
    #: `constexpr_blockwise_shift_scale` allows: llama.cpp's Q4_1 / Q5_1 `d*q + m` grids.
    float_offset: bool = False
    #: ``+rN``: a rank-N correction of the codes' error rides beside them (`rlx_mil.compress.lowrank`).
    rank: int = 0

    def __post_init__(self) -> None:
        check_rank(self.rank)
        if self.float_offset and (self.symmetric or self.signed):
            raise InvalidOptionError("a float offset is for unsigned asymmetric codes (e.g. uint4-float)")
        if self.bits not in (4, 8):
            raise InvalidOptionError(f"linear quantization takes 4 or 8 bits, got {self.bits}")
        if self.granularity not in (PER_TENSOR, PER_CHANNEL, PER_BLOCK):
            raise InvalidOptionError(f"linear quantization granularity must be per_tensor, per_channel or per_block, got {self.granularity!r}")
        if isinstance(self.block_size, bool) or not isinstance(self.block_size, int) or self.block_size < 1:
            raise InvalidOptionError(f"block size must be a positive integer, got {self.block_size!r}")

    @property
    def dtype_name(self) -> str:
        return f"{'' if self.signed else 'u'}int{self.bits}"

    @property
    def mode(self) -> str:
        """coremltools' `OpLinearQuantizerConfig.mode`."""
        return "linear_symmetric" if self.symmetric else "linear"

    @property
    def quant_range(self) -> tuple[int, int]:
        """[qmin, qmax] exactly as coremltools' `get_quant_range`: symmetric signed codes drop
        the most negative value, symmetric unsigned ones the largest."""
        levels = 1 << self.bits
        if self.signed:
            lo, hi = -levels // 2, levels // 2 - 1
            if self.symmetric:
                lo += 1
        else:
            lo, hi = 0, levels - 1
            if self.symmetric:
                hi -= 1
        return lo, hi

    @property
    def has_offset(self) -> bool:
        return not (self.signed and self.symmetric)

    @property
    def label(self) -> str:
        parts = [self.dtype_name, "float" if self.float_offset else ("sym" if self.symmetric else "asym")]
        if self.granularity == PER_BLOCK:
            parts.append(f"block{self.block_size}")
        else:
            parts.append("tensor" if self.granularity == PER_TENSOR else "channel")
        return "-".join(parts) + rank_suffix(self.rank)

    def coremltools_config(self) -> dict[str, Any]:
        """Keyword arguments of the equivalent `OpLinearQuantizerConfig`."""
        if self.float_offset or self.rank:
            raise InvalidOptionError(f"{self.label}: coremltools has no {'low-rank correction' if self.rank else 'float-offset linear quantizer'}")
        cfg: dict[str, Any] = {"mode": self.mode, "dtype": self.dtype_name, "granularity": self.granularity}
        if self.granularity == PER_BLOCK:
            cfg["block_size"] = self.block_size
        return cfg


@dataclass(frozen=True)
class PaletteScheme:
    """A look-up table of 2**bits values fitted by 1-D k-means; each weight stores the index of
    its nearest entry. One table per tensor, or per group of `group_size` output channels."""

    bits: int = 4
    granularity: str = PER_GROUPED_CHANNEL
    group_size: int = DEFAULT_GROUP_SIZE
    #: False for a bare ``lutN``: a target without grouped tables (iOS16/17) then gets one
    #: table per tensor instead of an error.
    explicit: bool = field(default=True, compare=False, repr=False)
    #: ``lutN-scaled``: each output channel is divided by its largest magnitude before the
    #: table is fitted, and an fp16 scale per output channel restores it
    #: (`constexpr_lut_to_dense` then `constexpr_blockwise_shift_scale`, iOS18): coremltools'
    #: `OpPalettizerConfig(enable_per_channel_scale=True)`.
    channel_scale: bool = False
    #: ``+rN``: a rank-N correction of the codes' error rides beside them (`rlx_mil.compress.lowrank`).
    rank: int = 0

    def __post_init__(self) -> None:
        check_rank(self.rank)
        if self.bits not in PALETTE_BITS:
            raise InvalidOptionError(f"palettization takes {'/'.join(map(str, PALETTE_BITS))} bits, got {self.bits}")
        if self.granularity not in (PER_TENSOR, PER_GROUPED_CHANNEL):
            raise InvalidOptionError(f"palettization granularity must be per_tensor or per_grouped_channel, got {self.granularity!r}")
        if isinstance(self.group_size, bool) or not isinstance(self.group_size, int) or self.group_size < 1:
            raise InvalidOptionError(f"group size must be a positive integer, got {self.group_size!r}")

    @property
    def label(self) -> str:
        grouping = f"-group{self.group_size}" if self.granularity == PER_GROUPED_CHANNEL else "-tensor"
        return f"lut{self.bits}{grouping}" + ("-scaled" if self.channel_scale else "") + rank_suffix(self.rank)

    def coremltools_config(self) -> dict[str, Any]:
        """Keyword arguments of the equivalent `OpPalettizerConfig`."""
        if self.rank:
            raise InvalidOptionError(f"{self.label}: coremltools has no low-rank correction")
        cfg: dict[str, Any] = {"mode": "kmeans", "nbits": self.bits, "granularity": self.granularity}
        if self.granularity == PER_GROUPED_CHANNEL:
            cfg["group_size"] = self.group_size
        if self.channel_scale:
            cfg["enable_per_channel_scale"] = True
        return cfg


Scheme = LinearScheme | PaletteScheme

_NONE_WORDS = frozenset({"none", "fp16", "float", "off"})
_LINEAR_BASES = {"int8": (8, True), "uint8": (8, False), "int4": (4, True), "uint4": (4, False)}


def parse_scheme(text: str) -> Scheme | None:
    """A scheme from its text form (see the module doc); None for ``none``."""
    if not isinstance(text, str) or not text.strip():
        raise InvalidOptionError(f"a compression scheme is a non-empty string, got {text!r}")
    base_text, rank = split_rank(text)
    scheme = _parse_base(base_text, text)
    if rank and scheme is None:
        raise InvalidOptionError(f"compression scheme {text!r}: a low-rank correction needs codes to correct (not none)")
    return dataclasses.replace(scheme, rank=rank) if rank and scheme is not None else scheme


def _parse_base(body: str, text: str) -> Scheme | None:
    words = body.strip().lower().replace("_", "-").split("-")
    base, mods = words[0], [w for w in words[1:] if w]
    if base in _NONE_WORDS and not mods:
        return None
    if base in _LINEAR_BASES:
        bits, signed = _LINEAR_BASES[base]
        chosen = Modifiers(text, base)
        for mod in mods:
            if mod in ("sym", "symmetric"):
                chosen.set("symmetry", mod, True)
            elif mod in ("asym", "asymmetric", "linear"):
                chosen.set("symmetry", mod, False)
            elif mod in ("float", "minmax"):
                chosen.set("symmetry", mod, "float")
            elif mod in ("tensor", "pertensor"):
                chosen.set("granularity", mod, (PER_TENSOR, DEFAULT_BLOCK_SIZE))
            elif mod in ("channel", "perchannel"):
                chosen.set("granularity", mod, (PER_CHANNEL, DEFAULT_BLOCK_SIZE))
            elif m := re.fullmatch(r"(?:block|b)(\d*)", mod):
                chosen.set("granularity", mod, (PER_BLOCK, int(m.group(1)) if m.group(1) else DEFAULT_BLOCK_SIZE))
            else:
                raise InvalidOptionError(f"compression scheme {text!r}: unknown modifier {mod!r} for {base}"
                                         " (sym, asym, float, tensor, channel, block, blockN)")
        symmetry = chosen.get("symmetry", True)
        float_offset = symmetry == "float"
        if float_offset and signed:
            raise InvalidOptionError(f"compression scheme {text!r}: a float offset takes unsigned codes (uint4-float, uint8-float)")
        granularity, block = chosen.get("granularity", (PER_BLOCK if bits == 4 else PER_CHANNEL, DEFAULT_BLOCK_SIZE))
        return LinearScheme(bits=bits, signed=signed, symmetric=symmetry is True, granularity=granularity, block_size=block,
                            float_offset=float_offset)
    if m := re.fullmatch(r"lut(\d)", base):
        chosen = Modifiers(text, base)
        for mod in mods:
            if mod in ("tensor", "pertensor"):
                chosen.set("granularity", mod, (PER_TENSOR, DEFAULT_GROUP_SIZE))
            elif g := re.fullmatch(r"(?:group|g)(\d*)", mod):
                chosen.set("granularity", mod, (PER_GROUPED_CHANNEL, int(g.group(1)) if g.group(1) else DEFAULT_GROUP_SIZE))
            elif mod in ("scaled", "scale"):
                chosen.set("scale", mod, True)
            else:
                raise InvalidOptionError(f"compression scheme {text!r}: unknown modifier {mod!r} for {base}"
                                         " (tensor, group, groupN, scaled)")
        scaled = chosen.get("scale", False)
        # A scaled table is one per tensor unless a group is asked for (the Neural Engine form
        # measured in docs/compression.md: one table on max-normalised rows).
        granularity, group = chosen.get("granularity", (PER_TENSOR if scaled else PER_GROUPED_CHANNEL, DEFAULT_GROUP_SIZE))
        return PaletteScheme(bits=int(m.group(1)), granularity=granularity, group_size=group,
                             explicit=bool(mods), channel_scale=scaled)
    raise InvalidOptionError(
        f"unknown compression scheme {text!r}: expected int8, uint8, int4, uint4, lut1..lut8 (lut5/lut7 do not"
        " exist) or none, with '-'-joined modifiers"
    )


#: Named presets: one scheme for every eligible weight (embeddings and LM head included).
PRESETS: dict[str, str] = {
    "int8": "int8-sym-channel",
    "uint8": "uint8-asym-channel",
    "int4": "int4-sym-block32",
    # The 4-bit default: per-block int4 here; the Neural Engine form (`deploy="ane"`) reads it as
    # lut4-scaled before parsing (`rlx_mil.coreml.deploy.compression`).
    "4bit": "int4-sym-block32",
    "uint4": "uint4-asym-block32",
    "lut2": "lut2",
    "lut3": "lut3",
    "lut4": "lut4",
    "lut6": "lut6",
    "lut8": "lut8",
}


#: ``autoN``: the default size budget (fraction of the fp16 weight bytes) and the scheme every
#: weight starts from before the mix widens the ones that need it.
AUTO_BUDGETS: dict[int, float] = {3: 0.24, 4: 0.30, 6: 0.42, 8: 0.55}
AUTO_START: dict[int, str] = {3: "lut3", 4: "lut4", 6: "lut6", 8: "int8"}


@dataclass(frozen=True)
class Rule:
    """Weights whose name matches `pattern` get `scheme` (None keeps them in float)."""

    pattern: str
    scheme: Scheme | None
    regex: bool = False

    def __post_init__(self) -> None:
        if self.regex:
            try:
                re.compile(self.pattern)
            except re.error as err:
                raise InvalidOptionError(f"compression rule: bad regular expression {self.pattern!r}: {err}") from None

    def matches(self, name: str) -> bool:
        if self.regex:
            return re.search(self.pattern, name) is not None
        return fnmatch.fnmatchcase(name, self.pattern)

    @property
    def label(self) -> str:
        return f"{'re' if self.regex else 'glob'}:{self.pattern}"


class _Same:
    """Marker: embeddings / LM head take the default scheme."""

    def __repr__(self) -> str:
        return "SAME_AS_DEFAULT"


SAME_AS_DEFAULT: Any = _Same()


@dataclass(frozen=True)
class CompressionConfig:
    default: Scheme | None = None
    embeddings: Any = SAME_AS_DEFAULT
    lm_head: Any = SAME_AS_DEFAULT
    rules: tuple[Rule, ...] = field(default_factory=tuple)
    min_size: int = DEFAULT_MIN_SIZE
    #: Param name -> a weight its source already quantized (`rlx_mil.compress.prequantized`):
    #: its codes are kept as they are, whatever the other fields say.
    prequantized: Mapping[str, Any] = field(default_factory=dict, compare=False, hash=False)
    #: ``autoN``: a per-weight mix chosen from error statistics (`rlx_mil.compress.auto`);
    #: `default` is then the N-bit scheme every weight starts from.
    auto: int | None = None
    #: With `auto`: the package's weight bytes as a fraction of the fp16 weights' (default
    #: per width, `AUTO_BUDGETS`) and the largest estimated relative error of one weight.
    budget: float | None = None
    max_error: float | None = None
    #: The user's quality target: the quality check's thresholds for this conversion (its
    #: warning and `--verify` verdict) in place of the documented ones.
    max_kl: float | None = None
    min_top1: float | None = None
    #: Calibration inputs (input name -> array) for activation-aware choices and a measured
    #: output error.
    calibration: Mapping[str, Any] | None = field(default=None, compare=False, hash=False)
    #: The graph `calibration` is fed to, when the converted graph cannot take it (a stateful
    #: decode step): a stateless graph over the same Params (e.g. the checkpoint's plain graph
    #: over the calibration tokens). None: the converted graph.
    calibration_graph: Any = field(default=None, compare=False, hash=False)
    #: Params of `calibration_graph`'s own, read where the conversion's differ in shape (RoPE
    #: tables sized for its length); every other Param is the conversion's.
    calibration_params: Mapping[str, Any] | None = field(default=None, compare=False, hash=False)
    #: More inputs of `calibration_graph` that only a fit (`fit`) sees, each run alone (`sensitivity.fit_feeds`).
    fit_calibration: tuple[Mapping[str, Any], ...] = field(default=(), compare=False, hash=False)
    #: With `auto`: the schemes (text form, cheapest first) it chooses from instead of
    #: `rlx_mil.compress.auto.CANDIDATES` (a deployment form's own, e.g. no per-block ints on
    #: the Neural Engine).
    candidates: tuple[str, ...] | None = None
    #: With `candidates` and measured sensitivities: schemes narrower than the start that the
    #: weights the outputs hardly feel may take (cheapest first), paying for the ones they do.
    narrower: tuple[str, ...] = ()
    #: Without calibration: after compressing, compare the reference on the dequantized weights
    #: with the float weights on generated inputs and warn when an output moved too much.
    #: None (the default) runs it while the graph's weights as float32 fit in
    #: `CHECK_AUTO_LIMIT` bytes (the reference holds them whole, twice over: float and
    #: decoded); ``check=on`` runs it whatever the size, ``check=off`` never.
    check: bool | None = None
    #: Inputs the quality check runs on instead of the calibration or generated ones (e.g. a
    #: text tokenized by the caller), and the words the check's summary names them with.
    check_inputs: Mapping[str, Any] | None = field(default=None, compare=False, hash=False)
    check_label: str = field(default="", compare=False, hash=False)
    #: False: the conversion records no quality check of its own (a caller measures it once,
    #: on text, after converting every function of a stateful package).
    final_check: bool = field(default=True, compare=False, hash=False)
    #: True: the caller checked that every rule matches a weight of some graph it converts with
    #: this config (the packages of a speech folder, each holding part of the weights), so a
    #: graph none of whose weights a rule names is not refused for it.
    rules_checked: bool = field(default=False, compare=False, hash=False)
    #: With `auto`: a plan made across several graphs with one budget over them all (an
    #: `AutoPlan` holding every graph's weights; a speech folder's packages,
    #: `rlx_mil.compress.across`): each graph's weights take its schemes, no plan per graph.
    plan: Any = field(default=None, compare=False, hash=False)
    #: `FIT_MODES`: codes fitted to the calibration activations (needs `calibration`); None:
    #: the deployment form's choice (`rlx_mil.coreml.deploy.compression`), else off.
    fit: str | None = None

    def __post_init__(self) -> None:
        if isinstance(self.min_size, bool) or not isinstance(self.min_size, int) or self.min_size < 0:
            raise InvalidOptionError(f"min_size must be a non-negative integer, got {self.min_size!r}")
        if self.auto is not None and self.auto not in AUTO_BUDGETS:
            raise InvalidOptionError(f"auto compression takes {'/'.join(map(str, AUTO_BUDGETS))} bits, got {self.auto!r}")
        if self.budget is not None and not (isinstance(self.budget, (int, float)) and 0 < self.budget <= 1):
            raise InvalidOptionError(f"compression budget is a size fraction in (0, 1], got {self.budget!r}")
        if self.max_error is not None and not (isinstance(self.max_error, (int, float)) and 0 < self.max_error <= 1):
            # a weight's relative error ||W - Wq|| / ||W|| is 1 when it is zeroed: past 1, no limit is set
            raise InvalidOptionError(f"max_error is a relative error in (0, 1], got {self.max_error!r}")
        for option in ("max_kl", "min_top1"):
            if getattr(self, option) is not None:
                object.__setattr__(self, option, check_target(option, getattr(self, option)))
        mode, _, order = str(self.fit or "off").replace(" ", "").partition(",")
        if mode not in FIT_MODES or order not in ("", *FIT_ORDERS):
            raise InvalidOptionError(f"fit takes {'/'.join(FIT_MODES)}[,{'/'.join(FIT_ORDERS)}], got {self.fit!r}")
        if self.fit is not None:  # the default order unsaid, none without a fit
            object.__setattr__(self, "fit", mode if order in ("", FIT_ORDER) or mode == "off" else f"{mode},{order}")
        if (self.budget is not None or self.max_error is not None) and self.auto is None:
            raise InvalidOptionError("budget / max_error choose an automatic mix: use them with autoN (e.g. auto4)")

    @property
    def thresholds(self) -> QualityThresholds:
        """The quality check's thresholds: the documented ones, with the user's target."""
        return DEFAULT_THRESHOLDS.with_targets(self.max_kl, self.min_top1)

    def role_scheme(self, role: str) -> Scheme | None:
        chosen = {"embedding": self.embeddings, "lm_head": self.lm_head}.get(role, self.default)
        return self.default if chosen is SAME_AS_DEFAULT else chosen

    def describe(self) -> str:
        parts = [f"auto{self.auto}" if self.auto is not None else _label(self.default)]
        if self.budget is not None:
            parts.append(f"budget={self.budget:g}")
        if self.max_error is not None:
            parts.append(f"max_error={self.max_error:g}")
        for option in ("max_kl", "min_top1"):
            if getattr(self, option) is not None:
                parts.append(f"{option}={getattr(self, option):g}")
        if self.check is not None:
            parts.append("check=on" if self.check else "check=off")
        if self.fit not in (None, "off"):
            parts.append(f"fit={self.fit}")
        if self.embeddings is not SAME_AS_DEFAULT:
            parts.append(f"embeddings={_label(self.embeddings)}")
        if self.lm_head is not SAME_AS_DEFAULT:
            parts.append(f"lm_head={_label(self.lm_head)}")
        parts += [f"{r.label}={_label(r.scheme)}" for r in self.rules]
        parts.append(f"min_size={self.min_size}")
        if self.prequantized:
            kinds = sorted({w.label for w in self.prequantized.values()})
            parts.append(f"prequantized={counted(len(self.prequantized), 'weight')} ({', '.join(kinds)})")
        return ";".join(parts)


def _label(scheme: Scheme | None) -> str:
    return "none" if scheme is None else scheme.label


def _scheme_value(value: Any, what: str) -> Scheme | None:
    if value is None or isinstance(value, (LinearScheme, PaletteScheme)):
        return value
    if isinstance(value, str):
        return parse_scheme(PRESETS.get(value.strip().lower(), value))
    raise InvalidOptionError(f"{what}: expected a scheme name, LinearScheme, PaletteScheme or None, got {value!r}")


def _rule(pattern: Any, scheme: Any) -> Rule:
    if not isinstance(pattern, str) or not pattern:
        raise InvalidOptionError(f"compression rule pattern must be a non-empty string, got {pattern!r}")
    regex = pattern.startswith("re:")
    if regex or pattern.startswith("glob:"):
        pattern = pattern.split(":", 1)[1]
    return Rule(pattern=pattern, scheme=_scheme_value(scheme, f"rule {pattern!r}"), regex=regex)


def _int_option(value: Any, what: str) -> int:
    try:
        out = int(value)
    except (TypeError, ValueError):
        raise InvalidOptionError(f"{what} must be an integer, got {value!r}") from None
    return out


def _float_option(value: Any, what: str) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        raise InvalidOptionError(f"{what} must be a number, got {value!r}") from None


def _switch(value: Any, what: str) -> bool:
    if isinstance(value, bool):
        return value
    word = str(value).strip().lower()
    if word in ("on", "true", "yes", "1"):
        return True
    if word in ("off", "false", "no", "0", "none"):
        return False
    raise InvalidOptionError(f"{what} is on or off, got {value!r}")


def _parse_text(text: str) -> CompressionConfig:
    fields: dict[str, Any] = {}
    rules: list[Rule] = []
    for item in (part.strip() for part in text.split(";")):
        if not item:
            continue
        if item.startswith(("re:", "glob:")) or ("=" in item and item.split("=", 1)[0].strip().lower().replace("-", "_")
                                                 not in ("default", "embeddings", "lm_head", "min_size", "budget", "max_error", "max_kl", "min_top1",
                                                            "check", "fit")):
            if "=" not in item:
                raise InvalidOptionError(f"compression rule {item!r} needs PATTERN=SCHEME")
            pattern, scheme = item.rsplit("=", 1)
            rules.append(_rule(pattern.strip(), scheme.strip()))
            continue
        if "=" in item:
            key, value = (s.strip() for s in item.split("=", 1))
            key = key.lower().replace("-", "_")
            if key in fields:
                raise InvalidOptionError(f"compression option {key!r} is given twice")
            if key == "min_size":
                fields[key] = _int_option(value, "min_size")
            elif key in ("budget", "max_error"):
                fields[key] = _float_option(value, key)
            elif key in ("max_kl", "min_top1"):
                fields[key] = check_target(key, value)
            elif key == "check":
                fields[key] = _switch(value, key)
            elif key == "fit":
                fields[key] = value.lower()
            else:
                fields[key] = _scheme_value(value, key)
        else:
            if "default" in fields:
                raise InvalidOptionError(f"compression config {text!r} names two default schemes")
            if m := re.fullmatch(r"auto(\d)", item.lower()):
                fields["auto"] = int(m.group(1))
                fields["default"] = parse_scheme(AUTO_START.get(fields["auto"], "int8"))
            else:
                fields["default"] = _scheme_value(item, "default")
    return CompressionConfig(rules=tuple(rules), **fields)


def parse_compress(spec: Any) -> CompressionConfig | None:
    """`convert(compress=...)` / `--compress` in any accepted form -> a config (None: no compression).

    Accepts None, a preset or config string (module doc), a scheme object, a `CompressionConfig`,
    or a mapping with keys default (a scheme or "autoN") / embeddings / lm_head / min_size /
    budget / max_error / calibration (input name -> array) / rules (a sequence of
    (pattern, scheme) pairs, patterns as in the text form)."""
    if spec is None:
        return None
    if isinstance(spec, CompressionConfig):
        return spec
    if isinstance(spec, (LinearScheme, PaletteScheme)):
        return CompressionConfig(default=spec)
    if isinstance(spec, str):
        return _parse_text(spec)
    if isinstance(spec, Mapping):
        unknown = set(spec) - {"default", "embeddings", "lm_head", "min_size", "rules", "budget", "max_error", "calibration",
                               "check", "max_kl", "min_top1", "fit"}
        if unknown:
            raise InvalidOptionError(f"compress mapping: unknown keys {sorted(map(str, unknown))}")
        kwargs: dict[str, Any] = {}
        for key in ("default", "embeddings", "lm_head"):
            if key in spec:
                auto = re.fullmatch(r"auto(\d)", spec[key].strip().lower()) if key == "default" and isinstance(spec[key], str) else None
                if auto:
                    kwargs["auto"] = int(auto.group(1))
                    kwargs[key] = parse_scheme(AUTO_START.get(kwargs["auto"], "int8"))
                else:
                    kwargs[key] = _scheme_value(spec[key], key)
        for key in ("min_size", "budget", "max_error", "calibration", "max_kl", "min_top1", "fit"):
            if key in spec:
                kwargs[key] = spec[key]
        if "check" in spec:
            kwargs["check"] = _switch(spec["check"], "check")
        raw_rules = spec.get("rules", ())
        if isinstance(raw_rules, Mapping):
            raw_rules = list(raw_rules.items())
        if not isinstance(raw_rules, Sequence) or isinstance(raw_rules, str):
            raise InvalidOptionError("compress rules must be a sequence of (pattern, scheme) pairs")
        rules = []
        for entry in raw_rules:
            if not (isinstance(entry, Sequence) and not isinstance(entry, str) and len(entry) == 2):
                raise InvalidOptionError(f"compress rule {entry!r} is not a (pattern, scheme) pair")
            rules.append(_rule(entry[0], entry[1]))
        return CompressionConfig(rules=tuple(rules), **kwargs)
    raise InvalidOptionError(f"compress must be a string, scheme, CompressionConfig or mapping, got {type(spec).__name__}")


def unmatched_rules(config: CompressionConfig, roles: Mapping[str, str], graph_name: str) -> None:
    """Refuse rules that match no weight of the graph: a mistyped key (`lm_haed=none`) or
    pattern would otherwise be ignored without a word. The message names every such rule."""
    dead = [rule for rule in config.rules if not any(rule.matches(name) for name in roles)]
    if not dead:
        return
    problems = []
    for rule in dead:
        hint = difflib.get_close_matches(rule.pattern.lower(), ["embeddings", "lm_head", "min_size", "default"], n=1)
        near = difflib.get_close_matches(rule.pattern, list(roles), n=1, cutoff=0.8)
        extra = f" (did you mean the option {hint[0]!r}?)" if hint else (f" (did you mean {near[0]!r}?)" if near else "")
        problems.append(f"rule {rule.label!r} matches no weight{extra}")
    raise InvalidOptionError(
        f"compression rules match no weight of graph {graph_name!r} ({counted(len(roles), 'weight')}):\n  - " + "\n  - ".join(problems)
    )
