"""Which weight gets which scheme, and the compressor the lowering calls for each weight.

Roles come from how the graph uses a Param: the table of a Gather is an embedding; a matmul
weight whose product reaches a graph output through shape-only ops (or whose name says
``lm_head``) is the LM head; inputs of norm ops, RoPE tables and every rank-0/1 weight (norm
scales, biases) are protected; other float weights of rank >= 2 are ordinary weights.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from rlx_mil.compress.auto import AutoPlan, plan_auto
from rlx_mil.compress.code_store import CodeStore
from rlx_mil.compress.dequantized import DequantizedParams, encode, plain_encode, store_dtype
from rlx_mil.compress.emit import check_target, compressed_bytes, linear_op, palette_op
from rlx_mil.compress.fit import fit_to_shape
from rlx_mil.compress.fitting import CalibrationFit
from rlx_mil.compress.layout import (
    _MATMUL_WEIGHT,
    _matmul_weight_only,
    _predicted_layout,
    _user_map,
    _uses,
    storage_shape,
)
from rlx_mil.compress.linear import LinearCodes
from rlx_mil.compress.lowrank import FACTOR_SUFFIXES, CorrectedCodes, check_rank_fits, correct
from rlx_mil.compress.palette import PaletteCodes
from rlx_mil.compress.prequantized import (
    LutScaleCodes,
    PrequantizedScheme,
    lut_scale_bytes,
    lut_scale_op,
)
from rlx_mil.compress.report import CompressionReport, WeightReport
from rlx_mil.compress.schemes import (
    CHECK_AUTO_LIMIT,
    CompressionConfig,
    Scheme,
    unmatched_rules,
)
from rlx_mil.compress.sensitivity import (  # noqa: F401  (MIN_SAMPLE, measure_sample: part of this module's interface)
    KL_UNIT,
    MIN_SAMPLE,
    SQUARED_UNIT,
    Overlaid,
    Replaced,
    kl_for_top1,
    measure_sample,
    split_note,
)
from rlx_mil.compress.shared import current as shared_session
from rlx_mil.errors import CompressionError
from rlx_mil.ir.graph import Graph
from rlx_mil.ir.ops import Param
from rlx_mil.lowering.context import WeightSource
from rlx_mil.lowering.target import Precision, Target
from rlx_mil.progress import ItemCount

#: autoN measures each weight's effect on the outputs (one reference run per weight) while
#: weights x parameters x input elements stays below this (about a minute of NumPy); a larger
#: model has as many of its weights measured as fit (`measure_sample`), at least `MIN_SAMPLE`.
#: The elements counted are those the measurements score: a calibration split for fitted codes
#: (`sensitivity.held_apart`) counts its measuring part (each run costs twice as much).
MEASURE_LIMIT = 2 * 10**11
#: A model measured on a sample also has each of its layers measured whole (one reference run
#: per layer, `auto.layer_scaled`) while layers x parameters x input elements stays below this.
#: Off (0): on SmolLM2-135M's Neural Engine `auto4` (30 layers at 128 calibration tokens,
#: 5.2e11) the layer-scaled plan moved `int8` onto layers 0, 2, 11, 28 and 29 and kept top-1
#: 0.874 / KL 0.0452 where the kind means keep 0.876 / 0.0449, with perplexity x1.068 against
#: x1.029 (docs/compression.md), for 30 more reference runs. GPU `auto4` chose the same mix.
LAYER_MEASURE_LIMIT = 0
#: The same for a plan whose fitted codes are measured on calibration positions the fit did not
#: use (`sensitivity.held_apart`), where each layer is measured with its fitted codes (and
#: plainly). Off (0) by default. At 1e12 (SmolLM2-135M: 30 layers x 128 positions scored,
#: 5e11) its Neural Engine `auto4`, measured with the head's KL on a vocabulary sample
#: (`vocab_sample`, then on; since off), kept top-1 0.892, confident 0.977, KL 0.0422,
#: perplexity x1.053 (`rlx-mil eval`, 380 held-out positions) where the default (whole head,
#: no layers) keeps 0.887 / 0.969 / 0.0433 / x1.042, for a conversion of 2,417 s against
#: 1,411 s at load 11; that pair differs in two things, and the whole head with layers
#: measured is not measured yet (docs/compression.md).
FITTED_LAYER_MEASURE_LIMIT = 0
PROTECTED_ROLES = frozenset({"norm", "rope", "vector", "integer"})
_NORM_OPS = frozenset({"LayerNorm", "RmsNorm", "GroupNorm", "FusedResidualLN", "FusedResidualRmsNorm"})
_PASS_THROUGH = frozenset({"Reshape", "Cast", "Narrow", "Transpose", "Expand"})
_ROPE_NAME = re.compile(r"(^|[._])(rope|rotary|inv_freq|cos|sin)([._]|$)", re.IGNORECASE)
_LM_HEAD_NAME = re.compile(r"lm_head|(^|\.)output\.weight$", re.IGNORECASE)


def _feeds_output(graph: Graph, node_id: int, users: Mapping[int, list[int]]) -> bool:
    outputs = set(graph.outputs)
    current = node_id
    for _ in range(8):
        if current in outputs:
            return True
        nexts = users.get(current, [])
        if len(nexts) != 1 or graph.node(nexts[0]).op.type_name not in _PASS_THROUGH:
            return False
        current = nexts[0]
    return False


def param_roles(graph: Graph) -> dict[str, str]:
    """Param name -> role: embedding, lm_head, weight, norm, rope, vector (rank <= 1), integer."""
    users = _user_map(graph)
    roles: dict[str, str] = {}
    rank = {"rope": 5, "norm": 4, "embedding": 3, "lm_head": 2, "weight": 1, "vector": 0}
    for node in graph:
        if not isinstance(node.op, Param):
            continue
        name = node.op.name
        if not node.shape.dtype.is_float:
            roles[name] = "integer"
            continue
        found = "rope" if _ROPE_NAME.search(name) else ("lm_head" if _LM_HEAD_NAME.search(name) else "weight")
        for user_id, position, _ in _uses(graph, node.id, users):
            kind = graph.node(user_id).op.type_name
            role = "weight"
            if kind in _NORM_OPS and position >= 1:
                role = "norm"
            elif kind == "Rope" and position >= 1:
                role = "rope"
            elif kind == "Gather" and position == 0:
                role = "embedding"
            elif position in _MATMUL_WEIGHT.get(kind, ()) and _feeds_output(graph, user_id, users):
                role = "lm_head"
            if rank[role] > rank[found]:
                found = role
        if len(node.shape.dims) <= 1 and found not in ("norm", "rope"):
            found = "vector"
        prev = roles.get(name)
        roles[name] = found if prev is None or rank.get(found, 0) > rank.get(prev, 0) else prev
    return roles


class WeightCompressor:
    """Compresses each selected float weight when the lowering turns it into a constant."""

    def __init__(
        self, config: CompressionConfig, graph: Graph, target: Target, precision: Precision,
        params: Mapping[str, Any] | None = None,
    ) -> None:
        self.config = config
        self.params = params
        self.graph = graph
        self.target = target
        self.precision = precision
        self.roles = param_roles(graph)
        self._users = _user_map(graph)
        self.sizes = {n.op.name: n.shape.sizes() for n in graph if isinstance(n.op, Param)}
        self.schemes: dict[str, Scheme | PrequantizedScheme] = {}
        #: the weights compressed so far, shown beside the lowering's bar (`rlx_mil.progress`).
        self._count: ItemCount | None = None
        self.kept: dict[str, str] = {}
        #: Why a compressed weight got its scheme when it is not the config's default (the report's note).
        self.reasons: dict[str, str] = {}
        if not config.rules_checked:
            unmatched_rules(config, self.roles, graph.name)
        self.auto_names: list[str] = []  # the weights taking the config's default (what autoN may change)
        defaults = self.auto_names
        for name, role in self.roles.items():
            scheme, why = self._choose(name, role)
            if scheme is None:
                self.kept[name] = why
            else:
                self.schemes[name] = scheme
                self.reasons[name] = why
                if why == "" and scheme is config.role_scheme(role) and scheme is config.default:
                    defaults.append(name)
        self.notes: dict[str, str] = {}
        self.plan: AutoPlan | None = None
        self.fit = CalibrationFit.of(self, plain_encode)  # codes fitted to the calibration activations (`fit=`)
        #: Weights autoN measured better plainly encoded than fitted (`sensitivity.output_sensitivity`).
        self.plain_codes: dict[str, tuple[float, float]] = {}
        self.shared = shared_session()
        if self.shared is not None:
            self.shared.held += [params, config]
        # What identifies this compression across the functions of one conversion.
        self._shared_key = (id(params), id(config.calibration), config.describe(), target, precision)
        if config.auto is not None and config.plan is not None:  # planned across graphs: this one's part
            from rlx_mil.compress.across import part_of_plan
            self.plan = part_of_plan(config.plan, defaults, graph.name)
            self.schemes.update(self.plan.schemes)
            self.notes = dict(self.plan.notes)
        elif config.auto is not None:
            plan_key = (self._shared_key, tuple(sorted(defaults)))
            planned = self.shared.plans.get(plan_key) if self.shared else None
            if planned is None:
                self._plan_auto(defaults)
                if self.shared is not None:
                    self.shared.plans[plan_key] = (
                        {n: self.schemes[n] for n in defaults}, dict(self.notes), self.plan, dict(self.plain_codes))
            else:
                self.schemes.update(planned[0])
                self.notes, self.plan, self.plain_codes = dict(planned[1]), planned[2], dict(planned[3])
                self.fit.skip = self.fit.skip | frozenset(self.plain_codes)
        self._done: dict[tuple[str, str], Any] = {}
        #: The codes of each compressed weight (the arrays the program holds, no copy): what
        #: the conversion-time checks decode instead of encoding the weights again.
        self.codes: dict[str, LinearCodes | PaletteCodes | LutScaleCodes | CorrectedCodes] = {}
        #: By the id of a weight's constexpr var: the factor consts (B [r, in], A [out, r]) of
        #: its low-rank correction (`rlx_mil.compress.lowrank`), run beside each linear using it.
        self._corrections: dict[int, tuple[Any, Any]] = {}
        self.weights: list[WeightReport] = []
        self.store = CodeStore()  # large codes: in a temporary file while the program holds them

    def _choose(self, name: str, role: str) -> tuple[Scheme | PrequantizedScheme | None, str]:
        source = self.config.prequantized.get(name)
        if source is not None:
            return PrequantizedScheme(source.label), "the source file's own codes, kept exactly (its quantization grid)"
        for rule in self.config.rules:
            if rule.matches(name):
                return rule.scheme, f"rule {rule.label}"
        if role in PROTECTED_ROLES:
            return None, {"norm": "norm", "rope": "RoPE table", "vector": "bias/vector", "integer": "not float"}[role]
        count = int(np.prod(self.sizes[name], dtype=np.int64))
        if count < self.config.min_size:
            return None, f"below min_size {self.config.min_size}"
        scheme = self.config.role_scheme("weight" if role == "weight" else role)
        if scheme is None:
            return None, "config"
        own = role in ("embedding", "lm_head") and scheme is not self.config.default
        if scheme.rank and not own and (role != "weight" or not _matmul_weight_only(self.graph, name, self._users)):
            return dataclasses.replace(scheme, rank=0), f"{role}: no low-rank correction (not only a matmul's weight)"
        return scheme, f"{role}: the config's {role} scheme" if own else ""

    def auto_weights(self, names: list[str]) -> tuple[dict[str, Callable[[], np.ndarray]], dict[str, str], int, int]:
        """What autoN plans `names` from: a reader of each storage-layout array, the roles (a tied
        embedding is the LM head), the bytes of the other float weights, the fp16 bytes of all."""
        if self.params is None:
            raise CompressionError(f"auto{self.config.auto} compression chooses from the weights' values: pass params")
        params = self.params
        users = _user_map(self.graph)
        itemsize = np.dtype(store_dtype(self.precision)).itemsize
        floats = [n for n, r in self.roles.items() if r != "integer"]
        count = {n: int(np.prod(self.sizes[n], dtype=np.int64)) for n in floats}
        total = sum(count.values()) * itemsize
        fixed = sum(count[n] * itemsize for n in floats if n not in self.schemes)
        fixed += sum(count[n] * getattr(s, "bits", 8) // 8 for n, s in self.schemes.items() if n not in names)

        def reader(name: str) -> Callable[[], np.ndarray]:
            def read() -> np.ndarray:
                arr = np.asarray(params[name])
                return arr.reshape(arr.shape[-2:]).T if _predicted_layout(self.graph, name, users) == "kn" else arr
            return read

        roles = dict(self.roles)  # a tied embedding is also the LM head: its error reaches the logits
        for node in self.graph:
            if isinstance(node.op, Param) and roles.get(node.op.name) == "embedding" and any(
                p in _MATMUL_WEIGHT.get(self.graph.node(u).op.type_name, ()) for u, p, _ in _uses(self.graph, node.id, users)
            ):
                roles[node.op.name] = "lm_head"
        return {n: reader(n) for n in names}, roles, fixed, total

    def _plan_auto(self, names: list[str]) -> None:
        readers, roles, fixed, total = self.auto_weights(names)
        importance = None
        if self.config.calibration is not None:
            from rlx_mil.compress.calibration import activation_importance

            importance = activation_importance(self._calibration_graph(), self._calibration_params(), self.calibration_inputs())
        elements = sum(int(np.prod(self.sizes[n], dtype=np.int64)) for n, r in self.roles.items() if r != "integer")
        measure, sample, unit, measure_layer = self._output_sensitivity(names, lambda n: readers[n], elements)
        self.plan = plan_auto(self.config.auto or 4, readers, roles, self.target,
                              store_dtype(self.precision), fixed, total, self.config.budget, self.config.max_error, importance,
                              self.config.candidates, measure, sample, loss_target=self._loss_target(unit), loss_unit=unit,
                              narrower=self.config.narrower, measure_layer=measure_layer,
                              measured_note=split_note(self) if measure is not None else "",
                              uncorrected=self._uncorrected(names, roles))
        self.schemes.update(self.plan.schemes)
        self.notes = dict(self.plan.notes)
        if self.plain_codes:  # held apart, their fitted codes kept the model further off
            self.fit.skip = self.fit.skip | frozenset(self.plain_codes)
            for n, (plainly, fitted) in self.plain_codes.items():
                self.notes[n] = self.notes.get(n, "") + f"; plain codes (held apart {plainly:.2g}, fitted {fitted:.2g})"

    def _uncorrected(self, names: list[str], roles: Mapping[str, str]) -> set[str]:
        """The weights autoN gives no low-rank correction: the LM head and embeddings (a tied
        one is read by gathers), and any weight with a use other than a matmul's weight."""
        users = _user_map(self.graph)
        return {n for n in names if roles.get(n) in ("lm_head", "embedding") or not _matmul_weight_only(self.graph, n, users)}

    def _calibration_graph(self) -> Graph:
        return self.graph if self.config.calibration_graph is None else self.config.calibration_graph

    def _calibration_params(self) -> Mapping[str, Any]:
        """The params the calibration graph runs with: the conversion's, with that graph's own
        where their shapes differ (`Overlaid`)."""
        assert self.params is not None
        if self.config.calibration_graph is None:
            return self.params
        return Overlaid(self.params, self.config.calibration_graph, self.config.calibration_params)

    def _loss_target(self, unit: str) -> float | None:
        """The bound on the predicted loss autoN searches toward: with measured mean KL, the
        user's `max_kl` and the KL `min_top1` asks for (`kl_for_top1`), the tighter of the two;
        None without a target or without a KL to predict."""
        if unit != KL_UNIT:
            return None
        bounds = [b for b in (self.config.max_kl, None if self.config.min_top1 is None else kl_for_top1(self.config.min_top1))
                  if b is not None]
        return min(bounds) if bounds else None

    def _output_sensitivity(
        self, names: list[str], reader: Callable[[str], Callable[[], np.ndarray]], elements: int,
    ) -> tuple[Callable[[str, Scheme], float] | None, list[str] | None, str, Callable[[Mapping[str, Scheme]], float] | None]:
        """autoN's measured sensitivities (`rlx_mil.compress.sensitivity.output_sensitivity`)."""
        from rlx_mil.compress.sensitivity import output_sensitivity

        users = _user_map(self.graph)
        return output_sensitivity(
            self, names, reader, elements, (MEASURE_LIMIT, LAYER_MEASURE_LIMIT, FITTED_LAYER_MEASURE_LIMIT),
            lambda storage, scheme, name: encode(storage, scheme, self.precision, name),
            lambda name: _predicted_layout(self.graph, name, users) == "kn")

    def check(self) -> None:
        """Every problem the shapes and target reveal, before any weight is read."""
        problems = []
        users = _user_map(self.graph)
        for name, scheme in self.schemes.items():
            if self.roles.get(name) == "integer":
                problems.append(f"weight {name!r} is not float; only float weights can be compressed")
                continue
            layout = _predicted_layout(self.graph, name, users)
            if isinstance(scheme, PrequantizedScheme):
                if self.target < Target.IOS18:
                    problems.append(f"weight {name!r}: {scheme.label} codes need iOS18's constexpr_blockwise_shift_scale /"
                                    f" constexpr_lut_to_dense; {self.target.label} has no op that holds them (use iOS18)")
                elif layout != "dense":
                    problems.append(f"weight {name!r}: {scheme.label} codes are rows of the stored [out, in] weight; this graph"
                                    " uses it as a [K, N] matrix")
                continue
            shape = storage_shape(self.sizes[name], layout)
            try:
                fitted, _ = fit_to_shape(scheme, shape, self.target)
                check_target(fitted, self.target, name)
                check_rank_fits(fitted, shape, name)
                if fitted.rank and not _matmul_weight_only(self.graph, name, users):
                    raise CompressionError(f"weight {name!r}: {fitted.label}: a low-rank correction runs beside a matmul;"
                                           " this weight has other uses (a gather, a conv, ...): give it a scheme without '+r'")
            except CompressionError as err:
                problems.append(str(err))
        if problems:
            raise CompressionError("cannot compress as asked for " + self.target.label + ":\n  - " + "\n  - ".join(problems))

    def scheme_for(self, source: WeightSource | None) -> Scheme | PrequantizedScheme | None:
        return None if source is None else self.schemes.get(source.name)

    def correction(self, weight: Any) -> tuple[Any, Any] | None:
        """The factor consts (B [r, in], A [out, r]) of the low-rank correction of the compressed
        weight var `weight` (as `compress` gave it), None where it has none."""
        return self._corrections.get(id(weight))

    def compress(
        self, source: WeightSource, value: np.ndarray, *, layout: str, op_name: Callable[[], str]
    ) -> Any | None:
        """The constexpr var decoding the Param `source` (None when it stays float). `value` is
        the weight as the lowering holds it: [K, N] for layout "kn" (stored transposed as the
        `linear` weight), else as it is used."""
        scheme = self.scheme_for(source)
        if scheme is None:
            return None
        name = source.name
        arr = np.asarray(value)
        if arr.dtype.kind != "f" and arr.dtype.name != "bfloat16":
            return None
        storage = arr.T if layout == "kn" else arr
        # How the stored array relates to the Param as given (what dequantization undoes).
        param_layout = "kn" if (layout == "kn") != source.transposed else "dense"
        key = (name, param_layout)
        if key in self._done:
            return self._done[key]
        shared_key = (self._shared_key, name, param_layout, getattr(scheme, "label", str(scheme)), storage.shape)
        held = self.shared.codes.get(shared_key) if self.shared is not None else None
        if held is not None:  # another function of this conversion encoded it: the same arrays
            return self._emit(key, held[0], held[1], op_name)
        if isinstance(scheme, PrequantizedScheme):
            if param_layout != "dense":
                raise CompressionError(f"weight {name!r}: {scheme.label} codes are rows of the stored weight, used here transposed")
            codes: LinearCodes | PaletteCodes | LutScaleCodes | CorrectedCodes = self.config.prequantized[name].encode(
                store_dtype(self.precision), self.store.writer, self.target)
        if self._count is None:  # the schemes are final once weights arrive
            self._count = ItemCount("compressing weights", len(self.schemes))
        self._count.starting(name)
        note = self.reasons.get(name, "")
        if not isinstance(scheme, PrequantizedScheme):
            scheme, fitted = fit_to_shape(scheme, tuple(int(d) for d in storage.shape), self.target)
            note = "; ".join(filter(None, [self.notes.get(name, "") or note, fitted]))
            check_target(scheme, self.target, name)
            ahead = self.fit.ahead(name, param_layout == "kn")  # fitted in the graph's order (`fit=MODE,sequential`)
            if ahead is not None:
                codes = ahead
                if isinstance(ahead, CorrectedCodes):
                    note = "; ".join(filter(None, [note, f"rank-{scheme.rank} correction: {ahead.factor_bytes} bytes"]))
            elif not scheme.rank:
                codes = self.fit.encode(storage, scheme, name, self.store.writer)
            else:  # the correction is fitted to the codes stored (fitted ones too), weighted as they were
                if layout != "kn":
                    raise CompressionError(f"weight {name!r}: {scheme.label}: a low-rank correction runs beside a matmul;"
                                           " this use of the weight is not one")
                base = self.fit.encode(storage, dataclasses.replace(scheme, rank=0), name, self.store.writer)
                h = self.fit.hessian(name, storage.shape[1])
                corrected = correct(base, storage, scheme, store_dtype(self.precision), name, None if h is None else np.diag(h))
                codes = corrected
                note = "; ".join(filter(None, [note, f"rank-{scheme.rank} correction: {corrected.factor_bytes} bytes"
                                               + (", fitted to the calibration activations" if h is not None else "")]))
        after = lut_scale_bytes(codes) if isinstance(codes, LutScaleCodes) else compressed_bytes(codes, self.target)
        param_shape = storage.shape[::-1] if param_layout == "kn" else storage.shape
        entry = WeightReport(
            name=name, role=self.roles.get(name, "weight"), scheme=scheme.label, layout=param_layout,
            shape=[int(d) for d in param_shape], bytes_before=int(arr.size) * np.dtype(store_dtype(self.precision)).itemsize,
            bytes_after=after, relative_error=codes.relative_error, max_error=getattr(codes, "max_error", None), note=note,
            source=self._source_type(name),
        )
        if self.shared is not None:
            self.shared.codes[shared_key] = (codes, entry)
        return self._emit(key, codes, entry, op_name)

    def _source_type(self, name: str) -> str:
        """The type the source file held `name` in (a GGUF file's params say: `Q4_K`), else ""."""
        source_type = getattr(self.params, "source_type", None)
        return (source_type(name) or "") if callable(source_type) else ""

    def _emit(self, key: tuple[str, str], codes: LinearCodes | PaletteCodes | LutScaleCodes | CorrectedCodes,
              entry: WeightReport, op_name: Callable[[], str]) -> Any:
        """The constexpr var of `codes` in this function's program, recorded (with its op's name) in the report."""
        base = codes.base if isinstance(codes, CorrectedCodes) else codes
        build: Any = linear_op if isinstance(base, LinearCodes) else palette_op
        var = lut_scale_op(base, op_name(), self.store) if isinstance(base, LutScaleCodes) else build(
            base, self.target, op_name(), self.store)
        if isinstance(codes, CorrectedCodes):  # its factors, named after the op (how stored_weights finds them)
            from coremltools.converters.mil import Builder as mb

            self._corrections[id(var)] = (mb.const(val=codes.right, name=f"{var.op.name}{FACTOR_SUFFIXES[0]}"),
                                          mb.const(val=codes.left, name=f"{var.op.name}{FACTOR_SUFFIXES[1]}"))
        entry.ops += [var.op.name] if var.op.name not in entry.ops else []  # this function's name for it
        self.weights.append(entry)
        self._done[key] = var
        self.codes[entry.name] = codes
        return var

    def report(self) -> CompressionReport:
        compressed = {w.name for w in self.weights}
        kept = {n: why for n, why in self.kept.items() if self.roles.get(n) != "integer"}
        kept.update({n: "folded into its op at conversion" for n in self.schemes if n not in compressed})
        report = CompressionReport(
            config=self.config.describe(), target=self.target.label, precision=self.precision.value,
            weights=list(self.weights), kept=kept, plan=self.plan.summary if self.plan else "",
            contributions=dict(self.plan.contributions) if self.plan else {},
        )
        checked = self.shared.checks.get(self._shared_key) if self.shared is not None else None
        if checked is not None:  # measured once, by the first function of this conversion
            for field_name, value in checked.items():
                setattr(report, field_name, value)
        elif (self.config.final_check and self.params is not None and self.weights and report.calibration_error is None
                and report.check_error is None):
            given = self._given_check_inputs() if self.config.check is not False else None
            if given is not None:
                report.check_error = self._measure(report, self.params, given, self.config.check_label or "the given check inputs")
            elif self.config.calibration is not None and self.config.calibration_graph is None:
                report.calibration_error = self._measure(report, self.params, self.calibration_inputs(), "the calibration inputs")
            elif self._checks():
                from rlx_mil.compress.calibration import example_inputs

                report.check_error = self._measure(report, self.params, example_inputs(self.graph),
                                                   "inputs generated for the check")
            if self.shared is not None:
                self.shared.checks[self._shared_key] = {
                    "check_error": report.check_error, "calibration_error": report.calibration_error, "quality": report.quality}
        return report

    def _given_check_inputs(self) -> dict[str, Any] | None:
        """`config.check_inputs` as the graph takes them; None when they do not fit it (a text
        tokenized for a decoder offered to a graph that takes no such tokens): the check then
        runs on the calibration or generated inputs."""
        from rlx_mil.ir.ops import Input
        from rlx_mil.ir.shape import Static

        given = self.config.check_inputs
        if given is None:
            return None
        feeds = {}
        for node in self.graph:
            if isinstance(node.op, Input):
                value = given.get(node.op.name)
                dims = node.shape.dims
                if value is None or np.ndim(value) != len(dims) or any(
                        isinstance(d, Static) and d.size != n for d, n in zip(dims, np.shape(value), strict=True)):
                    return None
                feeds[node.op.name] = value
        return feeds

    def _checks(self) -> bool:
        """Whether the output check on generated inputs runs: as the config says, else while the
        graph's weights as float32 fit in `CHECK_AUTO_LIMIT` bytes."""
        if self.config.check is not None:
            return self.config.check
        weights = sum(node.shape.numel() for node in self.graph if isinstance(node.op, Param) and node.shape.is_static)
        return 4 * weights <= CHECK_AUTO_LIMIT

    def calibration_inputs(self) -> dict[str, Any]:
        """The calibration arrays the graph takes (a tokenized text also offers masks)."""
        from rlx_mil.ir.ops import Input

        given = self.config.calibration or {}
        names = [n.op.name for n in self._calibration_graph() if isinstance(n.op, Input)]
        missing = [n for n in names if n not in given]
        if missing:
            raise CompressionError(f"calibration inputs lack the graph's inputs {missing} (given: {sorted(given)})")
        return {n: given[n] for n in names}

    def _measure(
        self, report: CompressionReport, params: Mapping[str, Any], inputs: Mapping[str, Any], where: str,
    ) -> dict[str, dict[str, float]]:
        """`inputs` through the reference with the uncompressed and with the dequantized weights
        (decoded from the codes the program holds): the relative error of each output, and the
        quality check (`report.quality`), which warns when a documented threshold is crossed."""
        from rlx_mil.compress.calibration import output_errors
        from rlx_mil.compress.quality_check import judge_outputs, warn_below_threshold
        from rlx_mil.compress.range_check import reference_outputs
        from rlx_mil.compress.report import worst_weights
        from rlx_mil.reference import evaluate

        want = reference_outputs(self.graph, inputs, params, self.precision, where)
        got = evaluate(self.graph, inputs, DequantizedParams(params, report, self.codes))
        errors = output_errors(got, want)
        compared = "the source file's decoded weights" if self.config.prequantized else "the uncompressed weights"
        check = judge_outputs(want, got, inputs, compared_with=compared, inputs_label=where, worst=worst_weights(report),
                              text="generated" not in where, thresholds=self.config.thresholds)
        report.quality = check.to_dict()
        warn_below_threshold(check, stacklevel=5)
        return errors
