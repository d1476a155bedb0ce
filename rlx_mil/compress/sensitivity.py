"""What autoN measures a weight's effect on the outputs with: the units, which weights are
measured when not all can be, the KL a top-1 target asks for, and params with one weight
replaced (what each measurement runs the reference on)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from rlx_mil.compress.auto import weight_kind
from rlx_mil.compress.schemes import Scheme
from rlx_mil.reference.overlay import ReplacedParams

#: The units of autoN's measured sensitivities (`WeightCompressor._output_sensitivity`).
KL_UNIT = "mean KL"
SQUARED_UNIT = "squared output error"
#: Fewer measured weights than this say too little: autoN then uses role factors.
MIN_SAMPLE = 8
#: A decoder's calibration token ids are split along the sequence (`held_apart`): codes fitted
#: to the calibration (`fit=`) see the activations of each row's first `FIT_SHARE` positions
#: only, and autoN's KL measurements score only the positions after them. Fitted codes learn
#: the tokens they are fitted on (a layer is 576-1536 inputs wide, more than a few hundred
#: tokens): measured on SmolLM2-135M's Neural Engine mix, each layer alone in fitted
#: `lut4-scaled`, the layers' KLs sum to 0.022 on the 128 tokens the fit used and 0.105 on
#: the calibration text's other tokens (0.170 on the held-out text), so measured on the fitted
#: tokens the plan prices fitted layers 5-20x too cheap against the weights it does not fit.
FIT_SHARE = 0.5
#: Fewer positions than this on either side of the split: none (the fit and the measurements
#: then share every position, and the plan says so).
MIN_PART = 16


def kl_for_top1(min_top1: float) -> float:
    """The mean KL a teacher-forced top-1 agreement of `min_top1` asks for, as autoN searches
    in KL: ``(2 (1 - top1))^2``, from the measured pairs on SmolLM2-135M (int8: KL 0.0048, top-1
    0.968; the GPU mix 0.0012, 0.975; Neural Engine mixes 0.178, 0.756 and 0.525, 0.64; lut6
    0.265, 0.706: ``1 - top1 ~= 0.5 sqrt(KL)`` within about 20 %). The check after converting
    judges the top-1 itself."""
    return (2.0 * (1.0 - min_top1)) ** 2


def held_apart(graph: Any, inputs: Mapping[str, Any]) -> int | None:
    """The first sequence position autoN's measurements score when the calibration is split
    (codes are fitted on the positions before it, `FIT_SHARE`): for a graph with a logits
    output fed `input_ids` of at least 2 x `MIN_PART` positions; None (no split) otherwise:
    generated inputs, an encoder's outputs (not judged per position), or too few tokens."""
    from rlx_mil.ir.naming import output_names

    ids = inputs.get("input_ids")
    if ids is None or np.ndim(ids) < 1 or not any("logits" in name for name in output_names(graph)):
        return None
    length = int(np.shape(ids)[-1])
    first = int(np.ceil(length * FIT_SHARE))
    return first if first >= MIN_PART and length - first >= MIN_PART else None


def fitted_from(compressor: Any) -> int | None:
    """Where a `WeightCompressor`'s calibration is split (`held_apart`): only when autoN plans
    codes fitted to it (`fit=`); None otherwise (unfitted codes are measured on every position,
    and a fixed scheme's fit, which nothing measures, uses every position)."""
    if compressor.config.auto is None or compressor.config.calibration is None or compressor.fit.options is None:
        return None
    return held_apart(compressor._calibration_graph(), compressor.calibration_inputs())


def split_note(compressor: Any) -> str:
    """What the plan's summary says of where fitted codes were measured and what they were
    fitted on ("" without a fit)."""
    if compressor.config.calibration is None or compressor.fit.options is None:
        return ""
    from rlx_mil.compress.moments import fit_tokens

    first = fitted_from(compressor)
    feeds = fit_feeds(compressor)
    more = len(feeds) - 1
    extra = "" if not more else f" and {more} more sequence{'s' * (more > 1)} of {feeds[1].length}"
    if first is None:
        return (f"; fitted codes measured on the positions they were fitted on (a decoder's {2 * MIN_PART}"
                f" or more calibration tokens would hold some apart); fitted on {fit_tokens(feeds)} tokens"
                f" (the calibration's{extra})")
    length = int(np.shape(compressor.calibration_inputs()["input_ids"])[-1])
    return (f"; fitted codes measured on calibration positions {first}-{length - 1}, which the fit did not use;"
            f" fitted on {fit_tokens(feeds)} tokens (positions 0-{first - 1}{extra})")


def fit_feeds(compressor: Any) -> list[Any]:
    """The runs of the calibration graph a `WeightCompressor`'s fitted codes are fitted on
    (`rlx_mil.compress.moments.FitFeed`): its calibration inputs, of which the positions before
    the split (`fitted_from`; all without one), then each of the config's `fit_calibration`
    sequences whole (more of the built-in text, which nothing measures on)."""
    from rlx_mil.compress.moments import FitFeed
    from rlx_mil.errors import CompressionError

    inputs = compressor.calibration_inputs()
    feeds = [FitFeed(inputs, fitted_from(compressor))]
    for i, more in enumerate(compressor.config.fit_calibration):
        missing = [n for n in inputs if n not in more]
        if missing:
            raise CompressionError(f"fit calibration sequence {i} lacks the graph's inputs {missing} (given: {sorted(more)})")
        feeds.append(FitFeed({n: more[n] for n in inputs}))
    return feeds


def fit_moments(compressor: Any) -> dict[str, Any]:
    """Param name -> the `SecondMoment` of its matmul input over `fit_feeds` (each run alone:
    `rlx_mil.compress.moments.second_moments`): what fitted codes are fitted to."""
    from rlx_mil.compress.moments import second_moments

    return second_moments(compressor._calibration_graph(), compressor._calibration_params(), fit_feeds(compressor))


def measure_sample(names: list[str], roles: Mapping[str, str], count: int) -> list[str] | None:
    """The weights autoN measures when it cannot afford all of `names`: every embedding / LM
    head, then ordinary weights taken kind by kind (`weight_kind`: the same weight of each
    layer), one of each kind per round at layers spread over the depth (each kind and round
    at another depth), `count` in all; None below `MIN_SAMPLE`."""
    if count < MIN_SAMPLE:
        return None
    special = [n for n in names if roles.get(n, "weight") != "weight"][:count]
    kinds: dict[str, list[str]] = {}
    for n in names:
        if n not in special:
            kinds.setdefault(weight_kind(n), []).append(n)
    groups = list(kinds.values())
    chosen = list(special)
    seen = set(chosen)
    for r in range(max(map(len, groups), default=0)):
        for j, group in enumerate(groups):
            if len(chosen) >= count:
                return chosen
            depth = ((j + 0.5) / len(groups) + r * 0.618034) % 1.0
            free = [n for n in group if n not in seen]
            if free:
                # The free weight nearest the wanted depth (layers already taken are skipped).
                pick = min(free, key=lambda n: abs(group.index(n) - depth * (len(group) - 1)))
                chosen.append(pick)
                seen.add(pick)
    return chosen



class Replaced(ReplacedParams):
    """`params` with one weight's value replaced (`many`: several)."""

    def __init__(self, params: Mapping[str, Any], name: str, value: np.ndarray) -> None:
        super().__init__(params, {name: value})

    @classmethod
    def many(cls, params: Mapping[str, Any], values: Mapping[str, np.ndarray]) -> Replaced:
        out = cls.__new__(cls)
        ReplacedParams.__init__(out, params, values)
        return out


class Overlaid(ReplacedParams):
    """`params`, except where `graph` declares a Param of another shape and `own` (the graph's
    own params) has it: a calibration graph's RoPE tables, sized for its length."""

    def __init__(self, params: Mapping[str, Any], graph: Any, own: Mapping[str, Any] | None) -> None:
        from rlx_mil.ir.ops import Param

        super().__init__(params, {})
        if own is not None:
            for node in graph:
                if isinstance(node.op, Param) and node.op.name in own and node.shape.is_static:
                    if self.shape_of(node.op.name) != tuple(node.shape.sizes()):
                        self._values[node.op.name] = own[node.op.name]


def output_sensitivity(
    compressor: Any, names: list[str], reader: Callable[[str], Callable[[], np.ndarray]], elements: int,
    limits: tuple[int, int, int], plain: Callable[[np.ndarray, Scheme, str], Any], transposed: Callable[[str], bool],
) -> tuple[Callable[[str, Scheme], float] | None, list[str] | None, str, Callable[[Mapping[str, Scheme]], float] | None]:
    """autoN's measured sensitivities: the reference run with one weight compressed at a
    time, on the calibration inputs (else generated ones, unless check=off), for every
    weight while that costs at most `limits[0]` (weights x parameters x input elements),
    else for the sample of them that fits (`measure_sample`; None: all); and their unit.

    On a decoder's logits over token ids (`next_token_targets`) a measurement is the mean
    KL divergence from the float model's next-token distribution (the quality check's
    measure, so a target in KL can be searched for); else the outputs' squared relative
    error. With a sample, each layer is also measured whole (its weights encoded at once:
    `auto.layer_scaled`) while layers x parameters x input elements stays below `limits[1]`
    (`limits[2]` for fitted codes measured on a split calibration);
    the last element is that measurement (None: not measured). `plain(storage, scheme, name)`
    encodes without the fit; `transposed(name)`: the weight is stored as the transpose of its
    Param.

    With fitted codes on a split calibration (`fitted_from`) each measurement runs with the
    codes fitted (on the positions before the split) and plainly encoded, judged on the
    positions after it: the smaller loss counts, and where plain codes keep the model closer
    the weight (a layer's: its weights not measured alone) is recorded in
    `compressor.plain_codes` (name -> (plain loss, fitted loss)), which the conversion then
    encodes plainly."""
    from rlx_mil.compress.auto import layer_count
    from rlx_mil.compress.calibration import example_inputs
    from rlx_mil.compress.fit import fit_to_shape
    from rlx_mil.compress.quality import kl_per_position
    from rlx_mil.compress.quality_check import _is_logits, next_token_targets
    from rlx_mil.compress.vocab_sample import large_head
    from rlx_mil.ir.naming import output_names, state_outputs
    from rlx_mil.ir.ops import Input, Param
    from rlx_mil.reference import evaluate, evaluate_all, evaluate_changed

    if compressor.config.calibration is None and not compressor._checks():
        return None, None, SQUARED_UNIT, None
    assert compressor.params is not None
    graph = compressor._calibration_graph()
    inputs = compressor.calibration_inputs() if compressor.config.calibration is not None else example_inputs(graph)
    tokens = max((int(np.asarray(v).size) for v in inputs.values()), default=1)
    # A large vocabulary's head: runs end at its input, the logits over a vocabulary sample.
    head = large_head(graph) if compressor.config.calibration is not None else None
    judged = next_token_targets(inputs, (*np.shape(inputs.get("input_ids", ())), 1)) if head is not None else None
    if head is not None and judged is not None:
        graph, elements = head.graph, elements - head.skipped_elements(tokens)
    else:
        head = None
    split = fitted_from(compressor)
    if split is not None:  # the limits count the positions measured: those after the split
        tokens -= tokens * split // int(np.shape(inputs["input_ids"])[-1])
    sample = None
    if len(names) * elements * tokens > limits[0]:
        sample = measure_sample(names, compressor.roles, limits[0] // max(elements * tokens, 1))
        if sample is None:
            return None, None, SQUARED_UNIT, None
    params = compressor._calibration_params()
    # Every node's float value, kept while measuring: a measurement recomputes only what its
    # replaced weights reach (a layer and the ones after it), about half the model on average.
    # (A graph whose ops carry state runs whole: its final states are outputs too.)
    base = None if state_outputs(graph) else evaluate_all(graph, inputs, params, weights=False)
    if base is not None:  # not the weights (a float32 copy of a half-precision checkpoint's)
        base = {i: v for i, v in base.items() if not isinstance(graph.node(i).op, (Input, Param))}
    want = ({k: np.asarray(v, np.float64) for k, v in evaluate(graph, inputs, params).items()} if base is None else
            {k: np.asarray(base[i], np.float64) for k, i in zip(output_names(graph), graph.outputs, strict=True)})
    logits = {k: found[0] for k, w in want.items() if _is_logits(k, w) and (found := next_token_targets(inputs, w.shape))}
    unit = KL_UNIT if logits and compressor.config.calibration is not None else SQUARED_UNIT
    first = split if unit == KL_UNIT or head is not None else None
    if first is not None:  # fitted codes: judged only where the fit did not look (`held_apart`)
        logits = {k: keep & (np.arange(keep.shape[-1]) >= first) for k, keep in logits.items()}
    if head is not None and judged is not None:
        keep = judged[0] if first is None else judged[0] & (np.arange(judged[0].shape[-1]) >= first)
        head.prepare(next(iter(want.values())), params[head.weight], keep)
        unit = KL_UNIT

    def replaced(name: str, scheme: Scheme, fitted_codes: bool) -> np.ndarray:
        storage = reader(name)()
        fitted, _ = fit_to_shape(scheme, tuple(int(d) for d in storage.shape), compressor.target)
        back = (compressor.fit.encode(storage, fitted, name) if fitted_codes else
                plain(storage, fitted, name)).dequantize()
        shape = np.shape(params[name])
        return (back.T if transposed(name) else back).reshape(shape)

    def loss(values: Mapping[str, np.ndarray]) -> float:
        changed = Replaced.many(params, values)
        got = evaluate(graph, inputs, changed) if base is None else evaluate_changed(graph, inputs, changed, base, values)
        if head is not None:
            return head.mean_kl(next(iter(got.values())), values.get(head.weight))
        if unit == KL_UNIT:
            return float(np.mean([np.mean(kl_per_position(want[k][keep], np.asarray(got[k])[keep]))
                                  for k, keep in logits.items()]))
        return float(np.mean([np.sum((np.asarray(got[k], np.float64) - w) ** 2) / max(float(np.sum(w * w)), 1e-30)
                              for k, w in want.items()]))

    alone: set[str] = set()
    choices: dict[str, tuple[float, float]] = compressor.plain_codes

    def measure(name: str, scheme: Scheme) -> float:
        fitted = loss({name: replaced(name, scheme, True)})
        if first is None or name in compressor.fit.skip:
            return fitted
        # Held apart, fitted codes can lose to plain ones: the weight takes whichever keeps more.
        alone.add(name)
        plainly = loss({name: replaced(name, scheme, False)})
        if plainly < fitted:
            choices[name] = (plainly, fitted)
        return min(fitted, plainly)

    def measure_layer(schemes: Mapping[str, Scheme]) -> float:
        plainly = loss({n: replaced(n, s, False) for n, s in schemes.items()})
        if first is None:  # nothing fitted, or fitted codes measured where they were fitted: plainly
            return plainly
        fitted = loss({n: replaced(n, s, True) for n, s in schemes.items()})
        if plainly < fitted:  # the layer's weights not measured alone take plain codes
            choices.update({n: (plainly, fitted) for n in schemes if n not in alone and n not in compressor.fit.skip})
        return min(fitted, plainly)

    layered = sample is not None and layer_count(names) * elements * tokens <= limits[1 if first is None else 2]
    return measure, sample, unit, measure_layer if layered else None
