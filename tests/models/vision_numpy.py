"""Independent NumPy forwards of the vision towers, written from the published architectures
(transformers' `Dinov2Model`, `Dinov2WithRegistersModel`, `SiglipVisionModel`,
`Siglip2VisionModel`) and read straight from the checkpoint's tensors (float64).

Nothing here shares code with `rlx_mil.models.vision`: patches are cut by reshaping pixels,
position grids are resized by evaluating each output sample's taps directly (PyTorch's
`interpolate` formulas, align_corners=False), attention is written out with softmax.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

Tensors = Mapping[str, np.ndarray]


def _w(t: Tensors, name: str) -> np.ndarray:
    return np.asarray(t[name], dtype=np.float64)


def _keys(x: float, a: float) -> float:
    """Keys' cubic convolution kernel."""
    x = abs(x)
    if x <= 1:
        return (a + 2) * x ** 3 - (a + 3) * x ** 2 + 1
    if x < 2:
        return a * x ** 3 - 5 * a * x ** 2 + 8 * a * x - 4 * a
    return 0.0


def taps(n_in: int, n_out: int, mode: str, antialias: bool, i: int) -> dict[int, float]:
    """Source index -> weight of output sample i along one axis."""
    scale = n_in / n_out
    out: dict[int, float] = {}
    if antialias:
        stretch = max(scale, 1.0)
        half = (2 if mode == "bicubic" else 1) * stretch
        centre = (i + 0.5) * scale
        for j in range(n_in):
            if not int(centre - half + 0.5) <= j < int(centre + half + 0.5):
                continue
            u = (j + 0.5 - centre) / stretch
            out[j] = _keys(u, -0.5) if mode == "bicubic" else max(0.0, 1 - abs(u))
        total = sum(out.values())
        return {j: w / total for j, w in out.items()}
    src = (i + 0.5) * scale - 0.5
    if mode == "bilinear":
        src = max(src, 0.0)
        lo = min(math.floor(src), n_in - 1)
        hi = min(lo + 1, n_in - 1)
        out[lo] = out.get(lo, 0.0) + (1 - (src - lo))
        out[hi] = out.get(hi, 0.0) + (src - lo)
        return out
    base = math.floor(src)
    for k in range(-1, 3):
        j = min(max(base + k, 0), n_in - 1)
        out[j] = out.get(j, 0.0) + _keys(src - (base + k), -0.75)
    return out


def interpolate(grid: np.ndarray, rows: int, cols: int, mode: str, antialias: bool) -> np.ndarray:
    """`[H, W, C]` -> `[rows, cols, C]`, each output sample summed over its 2-D taps."""
    h, w, _ = grid.shape
    out = np.zeros((rows, cols, grid.shape[2]))
    for i in range(rows):
        row_taps = taps(h, rows, mode, antialias, i)
        for j in range(cols):
            col_taps = taps(w, cols, mode, antialias, j)
            for a, wa in row_taps.items():
                for b, wb in col_taps.items():
                    out[i, j] += wa * wb * grid[a, b]
    return out


def layer_norm(x: np.ndarray, t: Tensors, name: str, eps: float) -> np.ndarray:
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * _w(t, f"{name}.weight") + _w(t, f"{name}.bias")


def dense(x: np.ndarray, t: Tensors, name: str) -> np.ndarray:
    """`x @ W.T + b` (no b when the checkpoint stores none: DINOv2 with qkv_bias false)."""
    y = x @ _w(t, f"{name}.weight").T
    return y + _w(t, f"{name}.bias") if f"{name}.bias" in t else y


def gelu(x: np.ndarray, kind: str) -> np.ndarray:
    if kind == "gelu":
        erf = np.vectorize(math.erf)
        return 0.5 * x * (1 + erf(x / math.sqrt(2)))
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))


def mha(q: np.ndarray, k: np.ndarray, v: np.ndarray, heads: int, key_mask: np.ndarray | None = None) -> np.ndarray:
    """`[B, Sq, E]`, `[B, Sk, E]` x 2 -> `[B, Sq, E]`; key_mask `[B, Sk]` (1 = attend)."""
    b, sq, e = q.shape
    d = e // heads
    split = lambda x: x.reshape(b, x.shape[1], heads, d).transpose(0, 2, 1, 3)  # noqa: E731
    scores = split(q) @ split(k).transpose(0, 1, 3, 2) / math.sqrt(d)
    if key_mask is not None:
        scores = np.where(key_mask[:, None, None, :] > 0, scores, -np.inf)
    scores = np.exp(scores - scores.max(-1, keepdims=True))
    probs = scores / scores.sum(-1, keepdims=True)
    return (probs @ split(v)).transpose(0, 2, 1, 3).reshape(b, sq, e)


def patchify(pixels: np.ndarray, p: int) -> np.ndarray:
    """`[B, C, H, W]` -> `[B, (H/p) * (W/p), C * p * p]` (channel-major within a patch, as a conv kernel)."""
    b, c, h, w = pixels.shape
    rows, cols = h // p, w // p
    x = pixels[:, :, :rows * p, :cols * p].reshape(b, c, rows, p, cols, p)
    return x.transpose(0, 2, 4, 1, 3, 5).reshape(b, rows * cols, c * p * p)


def dinov2_forward(t: Tensors, cfg: Mapping[str, Any], pixels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(pooler_output, last_hidden_state) of `Dinov2Model` / `Dinov2WithRegistersModel`."""
    e, heads, p = cfg["hidden_size"], cfg["num_attention_heads"], cfg["patch_size"]
    eps, registers = cfg["layer_norm_eps"], cfg.get("num_register_tokens", 0)
    antialias = cfg["model_type"] == "dinov2_with_registers"
    b, _, height, width = pixels.shape
    kernel = _w(t, "embeddings.patch_embeddings.projection.weight").reshape(e, -1)
    x = patchify(pixels.astype(np.float64), p) @ kernel.T + _w(t, "embeddings.patch_embeddings.projection.bias")
    x = np.concatenate([np.broadcast_to(_w(t, "embeddings.cls_token"), (b, 1, e)), x], axis=1)
    table = _w(t, "embeddings.position_embeddings")[0]
    side = math.isqrt(table.shape[0] - 1)
    rows, cols = height // p, width // p
    if rows * cols != side * side or height != width:
        grid = interpolate(table[1:].reshape(side, side, e), rows, cols, "bicubic", antialias)
        table = np.concatenate([table[:1], grid.reshape(rows * cols, e)])
    x = x + table
    if registers:
        x = np.concatenate([x[:, :1], np.broadcast_to(_w(t, "embeddings.register_tokens"), (b, registers, e)), x[:, 1:]], 1)
    for i in range(cfg["num_hidden_layers"]):
        pre = f"encoder.layer.{i}"
        h = layer_norm(x, t, f"{pre}.norm1", eps)
        q, k, v = (dense(h, t, f"{pre}.attention.attention.{n}") for n in ("query", "key", "value"))
        a = dense(mha(q, k, v, heads), t, f"{pre}.attention.output.dense")
        x = x + a * _w(t, f"{pre}.layer_scale1.lambda1")
        h = layer_norm(x, t, f"{pre}.norm2", eps)
        if cfg.get("use_swiglu_ffn"):
            gate, up = np.split(dense(h, t, f"{pre}.mlp.weights_in"), 2, axis=-1)
            m = dense(gate / (1 + np.exp(-gate)) * up, t, f"{pre}.mlp.weights_out")
        else:
            m = dense(gelu(dense(h, t, f"{pre}.mlp.fc1"), cfg["hidden_act"]), t, f"{pre}.mlp.fc2")
        x = x + m * _w(t, f"{pre}.layer_scale2.lambda1")
    x = layer_norm(x, t, "layernorm", eps)
    return x[:, 0], x


def _siglip_tower(t: Tensors, v: Mapping[str, Any], x: np.ndarray, mask: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    heads, eps, act = v["num_attention_heads"], v["layer_norm_eps"], v["hidden_act"]
    r = "vision_model."
    for i in range(v["num_hidden_layers"]):
        pre = f"{r}encoder.layers.{i}"
        h = layer_norm(x, t, f"{pre}.layer_norm1", eps)
        q, k, val = (dense(h, t, f"{pre}.self_attn.{n}_proj") for n in ("q", "k", "v"))
        x = x + dense(mha(q, k, val, heads, mask), t, f"{pre}.self_attn.out_proj")
        h = layer_norm(x, t, f"{pre}.layer_norm2", eps)
        x = x + dense(gelu(dense(h, t, f"{pre}.mlp.fc1"), act), t, f"{pre}.mlp.fc2")
    x = layer_norm(x, t, f"{r}post_layernorm", eps)
    # the attention pooling head: nn.MultiheadAttention over a learned probe
    b, e = x.shape[0], x.shape[2]
    w, bias = np.split(_w(t, f"{r}head.attention.in_proj_weight"), 3), np.split(_w(t, f"{r}head.attention.in_proj_bias"), 3)
    probe = np.broadcast_to(_w(t, f"{r}head.probe"), (b, 1, e))
    a = mha(probe @ w[0].T + bias[0], x @ w[1].T + bias[1], x @ w[2].T + bias[2], heads, mask)
    a = dense(a, t, f"{r}head.attention.out_proj")
    h = layer_norm(a, t, f"{r}head.layernorm", eps)
    pooled = a + dense(gelu(dense(h, t, f"{r}head.mlp.fc1"), act), t, f"{r}head.mlp.fc2")
    return pooled[:, 0], x


def siglip_forward(t: Tensors, cfg: Mapping[str, Any], pixels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(pooler_output, last_hidden_state) of `SiglipVisionModel`, interpolating the position
    embeddings when the image is not the trained size (`interpolate_pos_encoding=True`)."""
    v = cfg["vision_config"]
    e, p = v["hidden_size"], v["patch_size"]
    r = "vision_model."
    kernel = _w(t, f"{r}embeddings.patch_embedding.weight").reshape(e, -1)
    x = patchify(pixels.astype(np.float64), p) @ kernel.T + _w(t, f"{r}embeddings.patch_embedding.bias")
    table = _w(t, f"{r}embeddings.position_embedding.weight")
    side = math.isqrt(table.shape[0])
    rows, cols = pixels.shape[2] // p, pixels.shape[3] // p
    if rows * cols != side * side or pixels.shape[2] != pixels.shape[3]:
        table = interpolate(table.reshape(side, side, e), rows, cols, "bicubic", False).reshape(rows * cols, e)
    return _siglip_tower(t, v, x + table, None)


def siglip2_forward(t: Tensors, cfg: Mapping[str, Any], patches: np.ndarray, mask: np.ndarray,
                    shapes: list[tuple[int, int]]) -> tuple[np.ndarray, np.ndarray]:
    """(pooler_output, last_hidden_state) of `Siglip2VisionModel`: patches `[B, N, C * p * p]`,
    mask `[B, N]`, image b of `shapes[b]` = (rows, columns) of patches."""
    v = cfg["vision_config"]
    e = v["hidden_size"]
    r = "vision_model."
    x = dense(patches.astype(np.float64), t, f"{r}embeddings.patch_embedding")
    table = _w(t, f"{r}embeddings.position_embedding.weight")
    side = math.isqrt(table.shape[0])
    n = patches.shape[1]
    for b, (rows, cols) in enumerate(shapes):
        grid = interpolate(table.reshape(side, side, e), rows, cols, "bilinear", True).reshape(rows * cols, e)
        x[b] += np.concatenate([grid, np.repeat(grid[:1], n - rows * cols, axis=0)])
    return _siglip_tower(t, v, x, mask.astype(np.float64))
