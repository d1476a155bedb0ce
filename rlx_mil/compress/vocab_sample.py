"""autoN's measurements on a decoder of a large vocabulary: the head computed over a sample.

A measurement reruns the reference with one weight replaced and takes the mean KL of its
next-token distributions from the float model's. With a large vocabulary the LM head is most
of that run and of its memory (Gemma 3 270M: a 262,144 x 640 tied head, 63 % of the weights,
a [128, 262144] logits array per run), so the planner measured nothing there. Here each run
stops at the head's input (the final norm's output) and the head is computed over a sample
of the vocabulary: the union of the reference's `TOP_CANDIDATES` most likely tokens at each
position, plus `TAIL_SAMPLE` draws from the other tokens (a fixed seed), half in proportion to
the reference's mean probability over the positions and half uniformly, each weighted by one
over its chance of being drawn (importance sampling).

With d the change of each token's logit, KL(p || q) = log E_p[exp d] - E_p[d] exactly (the
softmax normalisations cancel), p being the reference's distribution, computed once over the
whole vocabulary. Both expectations are estimated over the sample, each sampled token weighted
by p times how many it stands for, self-normalised: exact on the top candidates, a uniform
estimate over the tail.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from rlx_mil.ir.graph import Graph
from rlx_mil.ir.ops import MatMul, Param, Transpose

#: A head over more tokens than this is measured on a vocabulary sample; None: never, the
#: default for now. Measured on Gemma 3 270M Q4_K_M (`convert-gguf --stateful --deploy ane`):
#: with the sample (32768) its plan measured 14 of 127 weights and predicted mean KL 0.0185,
#: but the package's check gave top-1 0.635, KL 0.37, ppl x1.352, where the unmeasured plan
#: keeps 0.859 / 0.087 / x1.087: the measurements priced codes fitted to the calibration
#: tokens on those same tokens, so `lut3` looked nearly free (docs/compression.md). With
#: fitted codes measured on positions the fit did not use (`held_apart`) it measured 13 and
#: kept top-1 0.851, KL 0.0876, ppl x1.068 (predicted KL 0.0686): no better than unmeasured,
#: for 741 s of CPU against 346 s. The sample itself gives the whole head's KL within 0.5 %
#: there (benchmarks/vocab_sample_kl.py).
VOCAB_LIMIT: int | None = None
#: The limit measured with (`benchmarks/vocab_sample_kl.py`, and what `VOCAB_LIMIT` would be).
MEASURED_LIMIT = 32768
#: The reference's most likely tokens at each position, always in the sample.
TOP_CANDIDATES = 64
#: Draws from the rest of the vocabulary (with replacement).
TAIL_SAMPLE = 4096
#: Rows of the full reference head computed at once (its logits in blocks of this many tokens).
_ROW_BLOCK = 16384
_PASS_THROUGH = ("Reshape", "Cast")


@dataclass
class SampledHead:
    """A decoder's logits output computed over a vocabulary sample (`large_head`)."""

    #: The graph the measurements run: the calibration graph ending at the head's input.
    graph: Graph
    #: The head's weight (a Param), held as [vocabulary, hidden] when `transposed`.
    weight: str
    transposed: bool
    vocabulary: int
    hidden_size: int
    #: Set by `prepare`: the sampled token ids, the log of how many tokens each stands for, and
    #: the reference's log-probabilities and logits there at the judged positions.
    rows: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    log_weight: np.ndarray = field(default_factory=lambda: np.zeros(0))
    log_p: np.ndarray = field(default_factory=lambda: np.zeros((0, 0)))
    logits: np.ndarray = field(default_factory=lambda: np.zeros((0, 0)))
    positions: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    head_rows: np.ndarray = field(default_factory=lambda: np.zeros((0, 0), np.float32))

    def skipped_elements(self, positions: int) -> int:
        """The head's weights a measurement over `positions` does not multiply, at least
        (what `measure_sample` need not pay for)."""
        return max(self.vocabulary - TOP_CANDIDATES * positions - TAIL_SAMPLE, 0) * self.hidden_size

    def _rows_of(self, weight: np.ndarray, rows: np.ndarray | slice) -> np.ndarray:
        """The head's [tokens, hidden] rows for token ids `rows` of its weight as the graph holds it."""
        w = np.asarray(weight)
        return np.asarray(w[rows] if self.transposed else w[:, rows].T, np.float32)

    def prepare(self, hidden: np.ndarray, head: np.ndarray, keep: np.ndarray, seed: int = 0) -> None:
        """The reference's distributions over the whole vocabulary at the judged positions
        (`keep`, from `next_token_targets`) from its hidden states and head weight, and the
        sample measured from then on."""
        self.positions = np.flatnonzero(np.asarray(keep).reshape(-1))
        h = np.asarray(hidden, np.float32).reshape(-1, self.hidden_size)[self.positions]
        full = np.empty((len(h), self.vocabulary), np.float32)  # once: [positions, vocabulary] in float32
        for start in range(0, self.vocabulary, _ROW_BLOCK):
            full[:, start:start + _ROW_BLOCK] = h @ self._rows_of(head, slice(start, start + _ROW_BLOCK)).T
        m = full.max(axis=1).astype(np.float64)
        p = np.exp(full - m[:, None].astype(np.float32))
        log_z = m + np.log(p.sum(axis=1, dtype=np.float64))
        count = min(TOP_CANDIDATES, self.vocabulary)
        chosen = np.unique(np.argpartition(-full, count - 1, axis=1)[:, :count])
        del full
        # The tail drawn in proportion to the reference's mean probability over the positions
        # (half of it; the other half uniform), each draw weighted by 1 / (draws x its chance).
        mean_p = (p / p.sum(axis=1, keepdims=True)).mean(axis=0, dtype=np.float64)
        del p
        rest = np.setdiff1d(np.arange(self.vocabulary), chosen, assume_unique=True)
        chance = 0.5 * mean_p[rest] / max(float(mean_p[rest].sum()), 1e-300) + 0.5 / max(len(rest), 1)
        draws = min(TAIL_SAMPLE, len(rest))
        tail, times = np.unique(np.random.default_rng(seed).choice(rest, draws, p=chance / chance.sum()), return_counts=True)
        tail_chance = chance[np.searchsorted(rest, tail)] / chance.sum()
        self.rows = np.concatenate([chosen, tail])
        self.log_weight = np.concatenate([np.zeros(len(chosen)), np.log(times / (draws * tail_chance))])
        self.head_rows = self._rows_of(head, self.rows)
        self.logits = (h @ self.head_rows.T).astype(np.float64)
        self.log_p = self.logits - log_z[:, None]

    def mean_kl(self, hidden: np.ndarray, head: np.ndarray | None = None) -> float:
        """The mean KL from the reference of a run's next-token distributions, from its hidden
        states (the head's input) and, when the head's weight is the one replaced, that weight."""
        h = np.asarray(hidden, np.float32).reshape(-1, self.hidden_size)[self.positions]
        rows = self.head_rows if head is None else self._rows_of(head, self.rows)
        d = (h @ rows.T).astype(np.float64) - self.logits
        log_w = self.log_p + self.log_weight
        norm = _logsumexp(log_w)
        kl = _logsumexp(log_w + d) - norm - np.sum(np.exp(log_w - norm[:, None]) * d, axis=1)
        return float(np.mean(np.maximum(kl, 0.0))) if kl.size else 0.0


def _logsumexp(x: np.ndarray) -> np.ndarray:
    m = x.max(axis=1)
    return m + np.log(np.sum(np.exp(x - m[:, None]), axis=1))


def large_head(graph: Graph, vocab_limit: int | None = None) -> SampledHead | None:
    """The graph's LM head when it has one output, logits over more than `vocab_limit` tokens
    (default `VOCAB_LIMIT`; None: never) from a MatMul of the hidden states by a Param (or its transpose)
    through shape-only ops; None otherwise (the logits are then computed whole)."""
    limit = VOCAB_LIMIT if vocab_limit is None else vocab_limit
    if limit is None or len(graph.outputs) != 1:
        return None
    node = graph.node(graph.outputs[0])
    while node.op.type_name in _PASS_THROUGH and len(node.inputs) == 1:
        node = graph.node(node.inputs[0])
    if not isinstance(node.op, MatMul) or len(node.inputs) != 2:
        return None
    hidden, rhs = graph.node(node.inputs[0]), graph.node(node.inputs[1])
    transposed = isinstance(rhs.op, Transpose) and tuple(getattr(rhs.op, "perm", ())) == (1, 0)
    param = graph.node(rhs.inputs[0]) if transposed else rhs
    if not isinstance(param.op, Param) or not param.shape.is_static or len(param.shape.dims) != 2:
        return None
    sizes = param.shape.sizes()
    vocabulary, width = (sizes[0], sizes[1]) if transposed else (sizes[1], sizes[0])
    if vocabulary <= max(limit, TOP_CANDIDATES + TAIL_SAMPLE) or not hidden.shape.is_static or (
            hidden.shape.sizes()[-1] != width):
        return None
    return SampledHead(_ending_at(graph, hidden.id), param.op.name, transposed, vocabulary, width)


def _ending_at(graph: Graph, node_id: int) -> Graph:
    """`graph`'s nodes up to `node_id`, which is its one output."""
    out = Graph(graph.name)
    for node in graph.nodes[: node_id + 1]:
        out.add_node(node.op, node.inputs, node.shape, name=node.name, origin=node.origin)
    out.set_outputs([node_id])
    return out
