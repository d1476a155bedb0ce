"""One autoN plan across several graphs that ship together (a speech folder's encoder and decoder
packages): one size budget over all their weights, each graph's sensitivities measured in its
own unit.

Each part (graph) brings its weights' candidate options (`auto.options_for`) and its measured
sensitivities in its own unit of loss: mean KL of the next-token distributions for a decoder,
the squared relative output error for an encoder. The units differ, so each part's loss counts
relative to its quality target (`PlanPart.target`, in the part's unit): a widening's gain is the
loss it removes over its part's target, per added byte. The greedy widening of `auto.choose`
then runs over every weight of every part against one byte budget (a fraction of all the parts'
fp16 weight bytes), so the bytes go where they bring a part closer to its target fastest: an
encoder that needs 8 bits while its decoder keeps 4 gets them, which one budget per graph cannot
give.

With a quality target the user asked for (`search`), the widening stops once every part is
predicted to meet its target; a budget too small for that is said, with the budget predicted
to meet it (`CompressionWarning`). Without one, the targets only weigh the parts' units against
each other: the summary says what each part is predicted to reach against its default target,
and claims no failure of a target nobody asked for.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass

from rlx_mil.compress.auto import AutoPlan, Option, _best_widening, predicted
from rlx_mil.errors import CompressionError, CompressionWarning
from rlx_mil.units import counted


@dataclass
class PlanPart:
    """One graph's share of a plan across graphs."""

    #: The graph's name (a package of the folder: "AudioEncoder").
    name: str
    #: Each weight the plan chooses for -> its candidate options, cheapest first.
    options: dict[str, list[Option]]
    #: Each weight -> its sensitivity: a candidate of weight-space error e is predicted to cost
    #: sensitivity * e^2 of the part's loss.
    sensitivities: dict[str, float]
    #: The unit of the part's loss ("mean KL", "squared output error").
    unit: str
    #: The part's quality target in its unit: what one unit of normalized loss is.
    target: float
    #: Bytes of the part's weights the plan does not choose for (kept float, fixed by rules).
    fixed_bytes: int
    #: The fp16 bytes of all the part's float weights.
    total_bytes: int
    #: A predicted loss as the user reads it (e.g. "cosine 0.995" for a squared error); None:
    #: the unit and the number.
    describe: Callable[[float], str] | None = None
    #: True: `target` is the plan's own default, not one the user asked for.
    default: bool = False

    def said(self, loss: float) -> str:
        return self.describe(loss) if self.describe is not None else f"{self.unit} {loss:.3g}"

    def against(self, loss: float, search: bool) -> str:
        """`loss` as the user reads it, with the target it is judged against, which is named a
        default target unless the user asked for it (`search` and not `default`)."""
        which = "target" if search and not self.default else "default target"
        return f"{self.said(loss)} ({which} {self.said(self.target)})"


def _loss(part: PlanPart, pick: Mapping[str, int]) -> float:
    return predicted(part.options, part.sensitivities, {n: pick[n] for n in part.options})


def _widen(parts: list[PlanPart], weights: Mapping[str, float], options: Mapping[str, list[Option]],
           pick: dict[str, int], used: int, cap: float, search: bool) -> int:
    """Widen `pick` greedily (the most normalized loss removed per added byte) within `cap`
    bytes; with `search`, only weights of parts still above their target, stopping once none
    is. Returns the bytes used."""
    while True:
        open_parts = [p for p in parts if not search or _loss(p, pick) > p.target * (1 + 1e-9)]
        if not open_parts:
            return used
        names = {n: pick[n] for p in open_parts for n in p.options}
        step = _best_widening(options, weights, names, cap - used)
        if step is None:
            return used
        _, n, j = step
        used += options[n][j].bytes - options[n][pick[n]].bytes
        pick[n] = j


def plan_across(bits: int, parts: list[PlanPart], budget: float, search: bool = False) -> AutoPlan:
    """The mix for every weight of `parts` within `budget` (a fraction of all their fp16 weight
    bytes); see the module doc. The plan's notes say per weight what it became and its predicted
    share of its part's loss; its summary says, per part, the loss predicted against the target."""
    options: dict[str, list[Option]] = {}
    weights: dict[str, float] = {}
    part_of: dict[str, str] = {}
    for part in parts:
        if part.target <= 0:
            raise CompressionError(f"part {part.name!r}: a plan target must be positive, got {part.target!r}")
        for name, opts in part.options.items():
            if name in part_of:
                raise CompressionError(f"weight {name!r} is in two parts of one plan ({part_of[name]}, {part.name})")
            part_of[name] = part.name
            options[name] = opts
            weights[name] = part.sensitivities[name] / part.target
    total = sum(p.total_bytes for p in parts)
    fixed = sum(p.fixed_bytes for p in parts)
    cap = budget * total
    pick = {n: 0 for n in options}
    used = fixed + sum(o[0].bytes for o in options.values())
    start = used
    used = _widen(parts, weights, options, pick, used, cap, search)
    reached = used / total if total else 1.0
    problems = []
    if start > cap:
        problems.append(f"the budget {budget:g}x cannot be met: the narrowest mix takes {start / total:.3f}x,"
                        f" give a budget of at least {math.ceil(start / total * 1000) / 1000:g}")
    missed = [p for p in parts if _loss(p, pick) > p.target * (1 + 1e-9)] if search else []
    if missed and not problems:
        wide = {n: len(o) - 1 for n, o in options.items()}
        if any(_loss(p, wide) > p.target * (1 + 1e-9) for p in missed):
            problems.append("the quality target cannot be met by any mix of the candidates: the widest is predicted at "
                            + ", ".join(f"{p.name} {p.said(_loss(p, wide))}" for p in parts))
        else:
            need = dict(pick)
            needed = _widen(parts, weights, options, need, used, float("inf"), True)
            problems.append("the quality target cannot be met within the budget: predicted "
                            + ", ".join(f"{p.name} {p.against(_loss(p, pick), search)}" for p in missed)
                            + f"; a budget of {math.ceil(needed / total * 1000) / 1000:g} is predicted to meet it")
    if problems:
        warnings.warn(CompressionWarning(f"auto{bits} across {', '.join(p.name for p in parts)}: {problems[0]}"),
                      stacklevel=2)
    schemes, notes, contributions = {}, {}, {}
    for name, i in pick.items():
        o = options[name][i]
        part = next(p for p in parts if p.name == part_of[name])
        schemes[name] = o.scheme
        contributions[name] = part.sensitivities[name] * o.error**2
        first = options[name][0]
        extra = "" if i == 0 else f"; {first.scheme.label} {first.error:.3g}"
        why = "the narrowest start" if i == 0 else "widened: among the largest losses removed per byte, across packages"
        notes[name] = (f"auto{bits}: est. error {o.error:.3g}{extra}; predicted {part.unit} {contributions[name]:.2g}"
                       f" of {part.name}'s ({why})")
    per_part = "; ".join(
        f"{p.name} {(p.fixed_bytes + sum(options[n][pick[n]].bytes for n in p.options)) / max(p.total_bytes, 1):.3f}x,"
        f" predicted {p.against(_loss(p, pick), search)}" for p in parts)
    widened = sum(1 for i in pick.values() if i)
    summary = (f"auto{bits} across {counted(len(parts), 'package')}: {widened} of {counted(len(pick), 'weight')} widened, {reached:.3f}x the"
               f" uncompressed weight bytes (one budget {budget:g}x over all; measured output sensitivities); {per_part}"
               + "".join(f"; {p}" for p in problems))
    return AutoPlan(schemes, notes, contributions, summary)


def part_of_plan(plan: AutoPlan, names: Collection[str], graph: str) -> AutoPlan:
    """The share of a plan across graphs (`plan_across`) that graph `graph`'s weights `names` take."""
    missing = [n for n in names if n not in plan.schemes]
    if missing:
        raise CompressionError(f"the compression plan made across packages has no scheme for {counted(len(missing), 'weight')}"
                               f" of graph {graph!r}: {', '.join(missing[:3])}")
    return AutoPlan({n: plan.schemes[n] for n in names}, {n: plan.notes[n] for n in names if n in plan.notes},
                    {n: plan.contributions[n] for n in names if n in plan.contributions}, plan.summary)
