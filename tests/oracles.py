"""Independent loop-based oracles for the trickier IR ops.

These are written straight from the spec with explicit Python loops in float64, sharing no
code with `rlx_mil.reference` (which is vectorised), so agreement between the two is
evidence rather than tautology. They are slow: use them on small tensors only.

Importable from any test module as `import oracles` (tests/ is on sys.path via conftest).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence

import numpy as np

ORACLE_FILL = -1e9


# ------------------------------------------------------------------------------ attention


def _layout_of(q_shape: tuple[int, ...], num_heads: int) -> str:
    if len(q_shape) == 4:
        return "bhsd" if q_shape[1] == num_heads else "bshd"
    return {3: "bsx", 2: "sx"}[len(q_shape)]


def _seq_len(shape: tuple[int, ...], layout: str) -> int:
    axis = {"bhsd": 2, "bshd": 1, "bsx": 1, "sx": 0}[layout]
    return shape[axis]


def _head_count(shape: tuple[int, ...], layout: str, head_dim: int) -> int:
    if layout == "bhsd":
        return shape[1]
    if layout == "bshd":
        return shape[2]
    return shape[-1] // head_dim


def _index(layout: str, b: int, h: int, s: int, d: int, head_dim: int) -> tuple[int, ...]:
    """Position of element (batch b, head h, token s, channel d) in a tensor of `layout`."""
    if layout == "bhsd":
        return (b, h, s, d)
    if layout == "bshd":
        return (b, s, h, d)
    if layout == "bsx":
        return (b, s, h * head_dim + d)
    return (s, h * head_dim + d)


def _vector(t: np.ndarray, layout: str, b: int, h: int, s: int, head_dim: int) -> list[float]:
    return [float(t[_index(layout, b, h, s, d, head_dim)]) for d in range(head_dim)]


def _key_visible(kind: str, window: int | None, i: int, j: int, q_len: int, kv_len: int) -> bool:
    position = max(kv_len - q_len, 0) + i
    if kind == "causal":
        return j <= position
    if kind == "sliding":
        assert window is not None
        return position - window <= j <= position
    return True


def attention_oracle(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    mask: np.ndarray | None = None,
    *,
    num_heads: int,
    head_dim: int,
    kind: str,
    window: int | None = None,
    score_scale: float | None = None,
    softcap: float | None = None,
) -> np.ndarray:
    """Attention by explicit loops. `kind`: none, causal, sliding, custom, bias."""
    layout = _layout_of(q.shape, num_heads)
    batch = 1 if layout == "sx" else q.shape[0]
    q_len, kv_len = _seq_len(q.shape, layout), _seq_len(k.shape, layout)
    kv_heads = _head_count(k.shape, layout, head_dim)
    group = num_heads // kv_heads
    scale = head_dim**-0.5 if score_scale is None else score_scale
    flat_mask = None if mask is None else np.asarray(mask, dtype=np.float64).ravel()
    bias = None
    if kind == "bias":
        assert mask is not None
        m = np.asarray(mask, dtype=np.float64)
        full = (batch, num_heads, q_len, kv_len)
        bias = m.reshape(full) if m.size == math.prod(full) and m.ndim != 4 else np.broadcast_to(m, full)
    out = np.zeros(q.shape, dtype=np.float64)
    for b in range(batch):
        for h in range(num_heads):
            kv_head = h // group
            for i in range(q_len):
                qi = _vector(q, layout, b, h, i, head_dim)
                scores = []
                for j in range(kv_len):
                    kj = _vector(k, layout, b, kv_head, j, head_dim)
                    s = sum(a * c for a, c in zip(qi, kj, strict=True)) * scale
                    if softcap is not None and softcap > 0:
                        s = softcap * math.tanh(s / softcap)
                    if kind == "custom":
                        assert flat_mask is not None
                        if not flat_mask[b * kv_len + j] >= 0.5:
                            s = ORACLE_FILL
                    elif kind == "bias":
                        assert bias is not None
                        s += float(bias[b, h, i, j])
                    elif not _key_visible(kind, window, i, j, q_len, kv_len):
                        s = ORACLE_FILL
                    scores.append(s)
                top = max(scores)
                weights = [math.exp(s - top) for s in scores]
                total = sum(weights)
                for d in range(head_dim):
                    acc = 0.0
                    for j in range(kv_len):
                        acc += weights[j] / total * float(v[_index(layout, b, kv_head, j, d, head_dim)])
                    out[_index(layout, b, h, i, d, head_dim)] = acc
    return out


def numeric_gradient(fn: Callable[[np.ndarray], float], x: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    """Central finite differences of a scalar function of one float64 array."""
    x = np.array(x, dtype=np.float64)
    grad = np.zeros_like(x)
    for idx in itertools.product(*(range(n) for n in x.shape)):
        saved = x[idx]
        x[idx] = saved + eps
        up = fn(x)
        x[idx] = saved - eps
        down = fn(x)
        x[idx] = saved
        grad[idx] = (up - down) / (2 * eps)
    return grad


def attention_grad_oracle(
    forward: Callable[..., np.ndarray],
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    dy: np.ndarray,
    wrt: str,
    eps: float = 1e-6,
) -> np.ndarray:
    """d sum(forward(q, k, v) * dy) / d(wrt) by central differences; `wrt` in q, k, v."""
    arrays = {"q": np.asarray(q, np.float64), "k": np.asarray(k, np.float64), "v": np.asarray(v, np.float64)}
    dy64 = np.asarray(dy, np.float64)

    def loss(x: np.ndarray) -> float:
        args = dict(arrays)
        args[wrt] = x
        return float(np.sum(np.asarray(forward(args["q"], args["k"], args["v"]), np.float64) * dy64))

    return numeric_gradient(loss, arrays[wrt], eps)


# ------------------------------------------------------------------------------ conv / pool


def conv_oracle(
    x: np.ndarray,
    w: np.ndarray,
    stride: Sequence[int],
    padding: Sequence[int],
    dilation: Sequence[int],
    groups: int,
) -> np.ndarray:
    """Grouped cross-correlation by loops over every output element and kernel tap."""
    n_batch, c_in = x.shape[:2]
    c_out = w.shape[0]
    kernel = w.shape[2:]
    spatial = len(kernel)
    out_sizes = [
        (x.shape[2 + a] + 2 * padding[a] - dilation[a] * (kernel[a] - 1) - 1) // stride[a] + 1
        for a in range(spatial)
    ]
    in_per_group, out_per_group = c_in // groups, c_out // groups
    y = np.zeros((n_batch, c_out, *out_sizes), dtype=np.float64)
    for n in range(n_batch):
        for co in range(c_out):
            g = co // out_per_group
            for pos in itertools.product(*(range(s) for s in out_sizes)):
                acc = 0.0
                for ci in range(in_per_group):
                    for tap in itertools.product(*(range(kk) for kk in kernel)):
                        src = [pos[a] * stride[a] - padding[a] + tap[a] * dilation[a] for a in range(spatial)]
                        if all(0 <= src[a] < x.shape[2 + a] for a in range(spatial)):
                            acc += float(x[(n, g * in_per_group + ci, *src)]) * float(w[(co, ci, *tap)])
                y[(n, co, *pos)] = acc
    return y


def pool_oracle(
    x: np.ndarray, kind: str, kernel: Sequence[int], stride: Sequence[int], padding: Sequence[int]
) -> np.ndarray:
    """Pooling by loops. Padded cells are skipped (they hold the reduction's identity);
    `mean` divides by the full kernel area."""
    n_batch, channels = x.shape[:2]
    spatial = len(kernel)
    out_sizes = [(x.shape[2 + a] + 2 * padding[a] - kernel[a]) // stride[a] + 1 for a in range(spatial)]
    y = np.zeros((n_batch, channels, *out_sizes), dtype=np.float64)
    for n in range(n_batch):
        for c in range(channels):
            for pos in itertools.product(*(range(s) for s in out_sizes)):
                cells = []
                for tap in itertools.product(*(range(kk) for kk in kernel)):
                    src = [pos[a] * stride[a] - padding[a] + tap[a] for a in range(spatial)]
                    if all(0 <= src[a] < x.shape[2 + a] for a in range(spatial)):
                        cells.append(float(x[(n, c, *src)]))
                if kind == "max":
                    value = max(cells) if cells else -math.inf
                elif kind == "min":
                    value = min(cells) if cells else math.inf
                elif kind == "sum":
                    value = math.fsum(cells)
                elif kind == "mean":
                    value = math.fsum(cells) / math.prod(kernel)
                else:
                    value = math.prod(cells)
                y[(n, c, *pos)] = value
    return y


# ------------------------------------------------------------------------------ rope


def rope_oracle(x: np.ndarray, cos: np.ndarray, sin: np.ndarray, head_dim: int, n_rot: int) -> np.ndarray:
    """Rotate-half rope by loops over (token position, head, pair)."""
    x64 = np.asarray(x, dtype=np.float64)
    out = x64.copy()
    half = n_rot // 2
    cos2 = np.asarray(cos, np.float64).reshape(-1, np.shape(cos)[-1])
    sin2 = np.asarray(sin, np.float64).reshape(-1, np.shape(sin)[-1])

    def row(s: int) -> int:
        return 0 if cos2.shape[0] == 1 else s

    if x64.ndim == 4:  # [B, H, S, D]
        for b, h, s in itertools.product(*(range(n) for n in x64.shape[:3])):
            for i in range(half):
                a, c = x64[b, h, s, i], x64[b, h, s, half + i]
                co, si = cos2[row(s), i], sin2[row(s), i]
                out[b, h, s, i] = a * co - c * si
                out[b, h, s, half + i] = c * co + a * si
        return out
    lead = x64.reshape(-1, x64.shape[-2], x64.shape[-1])  # [B, S, H*D]
    res = out.reshape(lead.shape)
    heads = x64.shape[-1] // head_dim
    for b in range(lead.shape[0]):
        for s in range(lead.shape[1]):
            for h in range(heads):
                base = h * head_dim
                for i in range(half):
                    a, c = lead[b, s, base + i], lead[b, s, base + half + i]
                    co, si = cos2[row(s), i], sin2[row(s), i]
                    res[b, s, base + i] = a * co - c * si
                    res[b, s, base + half + i] = c * co + a * si
    return res.reshape(x64.shape)


# ------------------------------------------------------------------------------ norms


def _rows(x: np.ndarray) -> np.ndarray:
    return np.asarray(x, dtype=np.float64).reshape(-1, np.shape(x)[-1])


def layer_norm_oracle(x: np.ndarray, gamma: np.ndarray, beta: np.ndarray, eps: float) -> np.ndarray:
    rows = _rows(x)
    out = np.zeros_like(rows)
    for r, values in enumerate(rows):
        n = len(values)
        mean = math.fsum(values) / n
        var = math.fsum((v - mean) ** 2 for v in values) / n
        for j, v in enumerate(values):
            out[r, j] = (v - mean) / math.sqrt(var + eps) * float(gamma[j]) + float(beta[j])
    return out.reshape(np.shape(x))


def rms_norm_oracle(x: np.ndarray, gamma: np.ndarray, beta: np.ndarray, eps: float) -> np.ndarray:
    rows = _rows(x)
    out = np.zeros_like(rows)
    for r, values in enumerate(rows):
        rms = math.sqrt(math.fsum(v * v for v in values) / len(values) + eps)
        for j, v in enumerate(values):
            out[r, j] = v / rms * float(gamma[j]) + float(beta[j])
    return out.reshape(np.shape(x))


def group_norm_oracle(
    x: np.ndarray, gamma: np.ndarray, beta: np.ndarray, num_groups: int, eps: float
) -> np.ndarray:
    """GroupNorm over `[N, C, *spatial]` by loops over (sample, group)."""
    x64 = np.asarray(x, dtype=np.float64)
    out = np.zeros_like(x64)
    n_batch, channels = x64.shape[:2]
    per_group = channels // num_groups
    for n in range(n_batch):
        for g in range(num_groups):
            chans = range(g * per_group, (g + 1) * per_group)
            values = [float(v) for c in chans for v in x64[n, c].ravel()]
            mean = math.fsum(values) / len(values)
            var = math.fsum((v - mean) ** 2 for v in values) / len(values)
            for c in chans:
                out[n, c] = (x64[n, c] - mean) / math.sqrt(var + eps) * float(gamma[c]) + float(beta[c])
    return out
