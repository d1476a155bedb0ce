"""ViT image encoders: DINOv2 (with or without registers) and the vision tower of SigLIP /
SigLIP2, as transformers' `Dinov2Model` / `SiglipVisionModel` / `Siglip2VisionModel` run them.

Inputs: `pixel_values` F32 `[B, C, H, W]` (DINOv2, SigLIP), or SigLIP2's NaFlex patches
`pixel_values` F32 `[B, N, C * p * p]` with `pixel_attention_mask` I32 `[B, N]` (1 = patch,
0 = padding) and `spatial_shapes` I32 `[B, 2]` (each image's rows and columns of patches)
unless the graph fixes one spatial shape. Patches: a stride-p convolution (DINOv2, SigLIP) or a linear layer (SigLIP2).
Position embeddings are the checkpoint's; when the image's patch grid is not the trained one,
the graph resizes the learned grid as transformers does: with two small constant matrices
(`rlx_mil.models.resize`) bicubic (DINOv2, SigLIP), bicubic with antialias (DINOv2 with
registers), bilinear with antialias (SigLIP2 with a fixed spatial shape); SigLIP2 with
`spatial_shapes` computes the bilinear antialiased weights of each image's shape in the graph.
Pre-norm layers; DINOv2's carry LayerScale and optionally SwiGLU.

Outputs: `pooler_output [B, E]` — DINOv2's CLS token after the final norm, SigLIP's
multihead-attention pooling head — or, with `normalize`, the L2-normalised `image_embeds`
(SigLIP's similarity embedding); without pooling `last_hidden_state [B, T, E]`.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from rlx_mil.errors import AmbiguousLayoutWarning, CheckpointError, InvalidOptionError
from rlx_mil.ir import Graph
from rlx_mil.ir.shape import MAX_TENSOR_ELEMENTS
from rlx_mil.models.budget import CHEAP_BUILD_BYTES, MAX_BUILD_BYTES, NODE_BYTES
from rlx_mil.models.graph_builder import WeightGraph
from rlx_mil.models.hf_config import VisionSpec
from rlx_mil.models.resize import resize_matrix
from rlx_mil.units import human_bytes

#: IR nodes per layer (measured about 30; rounded up) and around the layers.
NODES_PER_LAYER = 50
NODES_AROUND = 120


def _pair(value: object, what: str) -> tuple[int, int] | None:
    if value is None:
        return None
    pair = (value, value) if isinstance(value, int) and not isinstance(value, bool) else value
    if not isinstance(pair, (tuple, list)) or len(pair) != 2 or not all(
            isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in pair):
        raise InvalidOptionError(f"{what} must be an integer >= 1 or a (height, width) pair of them, got {value!r}")
    return int(pair[0]), int(pair[1])


@dataclass(frozen=True)
class VisionOptions:
    batch_size: int = 1
    #: DINOv2 / SigLIP: the image (height, width) in pixels (default: the trained size).
    image_size: tuple[int, int] | None = None
    #: SigLIP2: patches per image N (default: the config's `num_patches`).
    num_patches: int | None = None
    #: SigLIP2: the (rows, columns) of patches every image of this graph has; None: the graph
    #: takes `spatial_shapes` I32 `[B, 2]` as an input, as transformers does.
    spatial_shape: tuple[int, int] | None = None
    pooled: bool = True
    normalize: bool = False

    def validate(self, spec: VisionSpec) -> None:
        if isinstance(self.batch_size, bool) or not isinstance(self.batch_size, int) or self.batch_size < 1:
            raise InvalidOptionError(f"batch_size must be an integer >= 1, got {self.batch_size!r}")
        if self.normalize and not self.pooled:
            raise InvalidOptionError("normalize applies to the pooled image embedding; it needs pooling")
        if spec.naflex:
            if self.image_size is not None:
                raise InvalidOptionError(f"{spec.family} takes NaFlex patches: give the patches per image (seq_len)"
                                         " and, to fix one, a spatial_shape; not image_size")
            n = self.num_patches
            if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
                raise InvalidOptionError(f"num_patches (seq_len) must be an integer >= 1, got {n!r}")
            if self.spatial_shape is not None:
                rows, cols = self.spatial_shape
                if rows * cols > self.patches(spec):
                    raise InvalidOptionError(f"spatial_shape {rows} x {cols} holds more than the {self.patches(spec)}"
                                             " patches per image (num_patches / seq_len)")
            return
        if self.num_patches is not None or self.spatial_shape is not None:
            raise InvalidOptionError(f"{spec.family} takes whole images: give image_size, not num_patches (seq_len)"
                                     " or spatial_shape")
        height, width = self.pixels(spec)
        if height < spec.patch_size or width < spec.patch_size:
            raise InvalidOptionError(f"image_size {height} x {width} is smaller than one {spec.patch_size}-pixel patch")

    def pixels(self, spec: VisionSpec) -> tuple[int, int]:
        size = self.image_size or spec.image_size
        assert size is not None
        return size

    def grid(self, spec: VisionSpec) -> tuple[int, int]:
        """The image's patch grid (rows, columns); SigLIP2's fixed spatial shape (or (0, 0))."""
        if spec.naflex:
            return self.spatial_shape or (0, 0)
        height, width = self.pixels(spec)
        return height // spec.patch_size, width // spec.patch_size

    def patches(self, spec: VisionSpec) -> int:
        """Patch tokens per image."""
        if spec.naflex:
            return self.num_patches or spec.position_grid ** 2
        rows, cols = self.grid(spec)
        return rows * cols

    def tokens(self, spec: VisionSpec) -> int:
        extra = 1 + spec.num_register_tokens if spec.layout == "dinov2" else 0
        return self.patches(spec) + extra


def check_vision_sizes(spec: VisionSpec, options: VisionOptions, source: str,
                       precheck: Callable[[], None] | None = None) -> None:
    """Refuse (InvalidOptionError naming `source`) a graph too large to build or address,
    before it is built; a costly build runs `precheck` (the layers the checkpoint holds) first."""
    nodes = NODES_PER_LAYER * spec.num_layers + NODES_AROUND
    if nodes * NODE_BYTES > CHEAP_BUILD_BYTES and precheck is not None:
        precheck()
    if nodes * NODE_BYTES > MAX_BUILD_BYTES:
        raise InvalidOptionError(f"{source}: building this {spec.family} graph would allocate about"
                                 f" {human_bytes(nodes * NODE_BYTES)} ({nodes:,} graph nodes for {spec.num_layers:,}"
                                 f" layers), more than the limit of {human_bytes(MAX_BUILD_BYTES)}")
    b, t = options.batch_size, options.tokens(spec)
    sizes = {"activations [batch, tokens, intermediate_size]": b * t * max(spec.intermediate_size, spec.hidden_size),
             "attention scores [batch, heads, tokens, tokens]": b * spec.num_heads * t * t}
    if not spec.naflex:
        height, width = options.pixels(spec)
        sizes["pixel_values [batch, channels, height, width]"] = b * spec.num_channels * height * width
    elif options.spatial_shape is None:
        sizes["position weights [batch, patches, grid * grid]"] = b * t * spec.position_grid ** 2
    for what, count in sizes.items():
        if count > MAX_TENSOR_ELEMENTS:
            raise InvalidOptionError(f"{source}: {what} would hold {count:,} elements, more than the"
                                     f" {MAX_TENSOR_ELEMENTS:,} a Core ML tensor can address; use a smaller batch or image")


def layer_count(spec: VisionSpec, names: list[str]) -> int:
    """Encoder layers the stored tensor names hold."""
    pattern = re.compile(re.escape(spec.root) + (r"encoder\.layer\.(\d+)\." if spec.layout == "dinov2"
                                                 else r"encoder\.layers\.(\d+)\."))
    found = {int(m.group(1)) for name in names if (m := pattern.match(name))}
    return max(found) + 1 if found else 0


def check_layers(spec: VisionSpec, names: list[str], source: str) -> None:
    held = layer_count(spec, names)
    if held != spec.num_layers:
        raise CheckpointError(f"{source}: the config's sizes disagree with the checkpoint's tensors",
                              [f"num_hidden_layers is {spec.num_layers:,}, but the checkpoint's tensors hold {held:,} layers"])


class _Builder(WeightGraph):
    def __init__(self, spec: VisionSpec, options: VisionOptions, name: str) -> None:
        super().__init__(name)
        self.spec = spec
        self.options = options

    def norm(self, x: int, module: str) -> int:
        e = self.spec.hidden_size
        gamma = self.weight(f"{module}.weight", (e,))
        beta = self.weight(f"{module}.bias", (e,))
        return self.g.layer_norm(x, gamma, beta, eps=self.spec.layer_norm_eps, name=module)

    def act(self, x: int, name: str) -> int:
        return self.g.gelu(x, name=name) if self.spec.activation == "gelu" else self.g.gelu_approx(x, name=name)

    def resized_grid(self, grid: int, rows: int, cols: int, mode: str, antialias: bool, module: str) -> int:
        """`[g * g, E]` learned positions (node `grid`) -> `[rows * cols, E]`, resized as
        `interpolate(size=(rows, cols), align_corners=False)`: two constant matrices."""
        g, e, side = self.g, self.spec.hidden_size, self.spec.position_grid
        if (rows, cols) == (side, side):
            return grid
        row_t = g.constant(np.ascontiguousarray(resize_matrix(side, rows, mode, antialias).T), name=f"{module}.rows")
        col_t = g.constant(np.ascontiguousarray(resize_matrix(side, cols, mode, antialias).T), name=f"{module}.cols")
        x = g.reshape(grid, [side, side, e], name=f"{module}.grid")
        x = g.matmul(g.transpose(x, [1, 2, 0]), row_t, name=f"{module}.resize_rows")  # [g_c, E, rows]
        x = g.matmul(g.transpose(x, [2, 1, 0]), col_t, name=f"{module}.resize_cols")  # [rows, E, cols]
        x = g.transpose(x, [0, 2, 1], name=f"{module}.resized")
        return g.reshape(x, [rows * cols, e], name=f"{module}.resized_rows")

    def image_patches(self, prefix: str) -> int:
        """`pixel_values [B, C, H, W]` -> patch embeddings `[B, rows * cols, E]` (stride-p conv)."""
        s, o, g = self.spec, self.options, self.g
        b, e, p = o.batch_size, s.hidden_size, s.patch_size
        height, width = o.pixels(s)
        rows, cols = o.grid(s)
        pixels = g.input("pixel_values", [b, s.num_channels, height, width])
        kernel = self.weight(f"{prefix}.weight", (e, s.num_channels, p, p))
        x = g.conv(pixels, kernel, stride=[p, p], padding=[0, 0], name=prefix)
        x = g.transpose(g.reshape(x, [b, e, rows * cols], name=f"{prefix}.flatten"), [0, 2, 1], name=f"{prefix}.tokens")
        return g.add(x, self.weight(f"{prefix}.bias", (e,)), name=f"{prefix}.add_bias")

    # ------------------------------------------------------------------ DINOv2
    def dinov2_embeddings(self) -> int:
        s, o, g = self.spec, self.options, self.g
        b, e, side = o.batch_size, s.hidden_size, s.position_grid
        rows, cols = o.grid(s)
        x = self.image_patches("embeddings.patch_embeddings.projection")
        cls = g.expand(self.weight("embeddings.cls_token", (1, 1, e)), [b, 1, e], name="embeddings.cls")
        x = g.concat([cls, x], 1, name="embeddings.with_cls")
        positions = self.weight("embeddings.position_embeddings", (1, 1 + side * side, e))
        height, width = o.pixels(s)
        # transformers keeps the trained table only for as many patches as it has and a square image
        if rows * cols != side * side or height != width:
            flat = g.reshape(g.narrow(positions, 1, 1, side * side), [side * side, e], name="embeddings.grid")
            grid = self.resized_grid(flat, rows, cols, "bicubic", s.antialias, "embeddings.interpolate_pos_encoding")
            patch_rows = g.reshape(grid, [1, rows * cols, e], name="embeddings.patch_positions")
            positions = g.concat([g.narrow(positions, 1, 0, 1, name="embeddings.cls_position"), patch_rows], 1,
                                 name="embeddings.positions")
        x = g.add(x, positions, name="embeddings.add_positions")
        if s.num_register_tokens:
            r = s.num_register_tokens
            registers = g.expand(self.weight("embeddings.register_tokens", (1, r, e)), [b, r, e], name="embeddings.registers")
            x = g.concat([g.narrow(x, 1, 0, 1), registers, g.narrow(x, 1, 1, rows * cols)], 1, name="embeddings.with_registers")
        return x

    def dinov2_layer(self, x: int, p: str) -> int:
        s, g = self.spec, self.g
        e = s.hidden_size
        h = self.norm(x, f"{p}.norm1")
        a = self.attention(h, f"{p}.attention.attention.query", f"{p}.attention.attention.key",
                           f"{p}.attention.attention.value", s.qkv_bias, f"{p}.attention", None)
        a = self.linear(a, f"{p}.attention.output.dense", e, e, True)
        x = g.add(x, g.mul(a, self.weight(f"{p}.layer_scale1.lambda1", (e,)), name=f"{p}.layer_scale1"), name=f"{p}.residual1")
        h = self.norm(x, f"{p}.norm2")
        f = s.intermediate_size
        if s.swiglu:
            both = self.linear(h, f"{p}.mlp.weights_in", 2 * f, e, True)
            gate = g.silu(g.narrow(both, 2, 0, f, name=f"{p}.mlp.gate"), name=f"{p}.mlp.act")
            m = g.mul(gate, g.narrow(both, 2, f, f, name=f"{p}.mlp.up"), name=f"{p}.mlp.swiglu")
            m = self.linear(m, f"{p}.mlp.weights_out", e, f, True)
        else:
            m = self.act(self.linear(h, f"{p}.mlp.fc1", f, e, True), f"{p}.mlp.act")
            m = self.linear(m, f"{p}.mlp.fc2", e, f, True)
        return g.add(x, g.mul(m, self.weight(f"{p}.layer_scale2.lambda1", (e,)), name=f"{p}.layer_scale2"), name=f"{p}.residual2")

    # ------------------------------------------------------------------ SigLIP
    def siglip_embeddings(self, r: str) -> tuple[int, int | None]:
        """The embeddings and, for NaFlex, the patch mask as F32 `[B, N]`."""
        s, o, g = self.spec, self.options, self.g
        b, e, side = o.batch_size, s.hidden_size, s.position_grid
        n = o.patches(s)
        rows, cols = o.grid(s)
        table = self.weight(f"{r}embeddings.position_embedding.weight", (side * side, e))
        if not s.naflex:
            x = self.image_patches(f"{r}embeddings.patch_embedding")
            grid = self.resized_grid(table, rows, cols, "bicubic", False, f"{r}embeddings.interpolate_pos_encoding")
            return g.add(x, grid, name=f"{r}embeddings.add_positions"), None
        width = s.num_channels * s.patch_size * s.patch_size
        pixels = g.input("pixel_values", [b, n, width])
        mask = g.cast(g.input("pixel_attention_mask", [b, n], "i32"), "f32", name="pixel_attention_mask_float")
        x = self.linear(pixels, f"{r}embeddings.patch_embedding", e, width, True)
        if o.spatial_shape is None:
            return g.add(x, self.positions_of_shapes(table, f"{r}embeddings"), name=f"{r}embeddings.add_positions"), mask
        grid = self.resized_grid(table, rows, cols, "bilinear", True, f"{r}embeddings.resize_positional_embeddings")
        if n > rows * cols:  # padding positions take the first resized position, as transformers does
            pad = g.expand(g.narrow(grid, 0, 0, 1), [n - rows * cols, e], name=f"{r}embeddings.padding_positions")
            grid = g.concat([grid, pad], 0, name=f"{r}embeddings.positions")
        return g.add(x, grid, name=f"{r}embeddings.add_positions"), mask

    def positions_of_shapes(self, table: int, module: str) -> int:
        """`Siglip2VisionEmbeddings.resize_positional_embeddings` with `spatial_shapes` I32
        `[B, 2]` an input: output position n of image b is patch (n // cols_b, n % cols_b)
        (padding positions, n >= rows_b * cols_b, take patch (0, 0)); each axis weights the
        grid as bilinear antialiased interpolation does (scale = grid / size, support
        max(scale, 1), centre (i + 0.5) * scale - 0.5); `[B, N, g * g] @ table` -> `[B, N, E]`."""
        s, o, g = self.spec, self.options, self.g
        b, n, side = o.batch_size, o.patches(s), s.position_grid
        shapes = g.input("spatial_shapes", [b, 2], "i32")
        rows, cols = g.narrow(shapes, 1, 0, 1, name=f"{module}.rows"), g.narrow(shapes, 1, 1, 1, name=f"{module}.cols")
        index = g.constant(np.arange(n, dtype=np.int32).reshape(1, n), name=f"{module}.position_index")
        row_of = g.div(index, cols, name=f"{module}.row_of")  # integer division: exact in any precision
        col_of = g.sub(index, g.mul(row_of, cols), name=f"{module}.col_of")
        inside = g.cast(g.lt_(index, g.mul(rows, cols)), "f32", name=f"{module}.inside")
        source = g.constant(np.arange(side, dtype=np.float32).reshape(1, 1, side), name=f"{module}.source")
        # scale = grid / size looked up in a table of sizes 0..N: the package so declares
        # spatial_shapes within [0, N] (rlx_mil.input_contract); size 0 has no scale (NaN)
        by_size = np.array([np.nan] + [side / size for size in range(1, n + 1)], np.float32)
        scales = g.gather(g.constant(by_size, name=f"{module}.scale_table"), shapes, name=f"{module}.scales")  # [B, 2]

        def weights(at: int, axis: str) -> int:
            scale = g.narrow(scales, 1, 0 if axis == "row" else 1, 1, name=f"{module}.{axis}_scale")  # [B, 1]
            support = g.reshape(g.maximum(scale, self.scalar(1.0)), [b, 1, 1], name=f"{module}.{axis}_support")
            centre = g.sub(g.mul(g.add(g.mul(g.cast(at, "f32"), inside), self.scalar(0.5)), scale), self.scalar(0.5))
            distance = g.abs(g.sub(g.reshape(centre, [b, n, 1]), source), name=f"{module}.{axis}_distance")
            w = g.maximum(g.sub(self.scalar(1.0), g.div(distance, support)), self.scalar(0.0), name=f"{module}.{axis}_taps")
            return g.div(w, g.sum(w, [2], keep_dim=True), name=f"{module}.{axis}_weights")  # [B, N, g]

        both = g.mul(g.reshape(weights(row_of, "row"), [b, n, side, 1]),
                     g.reshape(weights(col_of, "col"), [b, n, 1, side]), name=f"{module}.weights")
        return g.matmul(g.reshape(both, [b, n, side * side]), table, name=f"{module}.resize_positional_embeddings")

    def siglip_layer(self, x: int, p: str, mask: int | None) -> int:
        s, g = self.spec, self.g
        e = s.hidden_size
        h = self.norm(x, f"{p}.layer_norm1")
        a = self.attention(h, f"{p}.self_attn.q_proj", f"{p}.self_attn.k_proj", f"{p}.self_attn.v_proj", True,
                           f"{p}.self_attn", mask)
        x = g.add(x, self.linear(a, f"{p}.self_attn.out_proj", e, e, True), name=f"{p}.residual1")
        h = self.norm(x, f"{p}.layer_norm2")
        return g.add(x, self.mlp(h, f"{p}.mlp"), name=f"{p}.residual2")

    def mlp(self, x: int, p: str) -> int:
        s = self.spec
        m = self.act(self.linear(x, f"{p}.fc1", s.intermediate_size, s.hidden_size, True), f"{p}.act")
        return self.linear(m, f"{p}.fc2", s.hidden_size, s.intermediate_size, True)

    def pooling_head(self, x: int, p: str, mask: int | None) -> int:
        """SigLIP's multihead attention pooling: a learned probe attends to every token
        (`nn.MultiheadAttention`: `in_proj_weight` q, k, v rows), then LayerNorm + MLP residual."""
        s, o, g = self.spec, self.options, self.g
        b, e, h, n = o.batch_size, s.hidden_size, s.num_heads, o.tokens(s)
        d = e // h
        probe = g.expand(self.weight(f"{p}.probe", (1, 1, e)), [b, 1, e], name=f"{p}.probe_rows")
        w = self.weight(f"{p}.attention.in_proj_weight", (3 * e, e))
        bias = self.weight(f"{p}.attention.in_proj_bias", (3 * e,))

        def project(value: int, index: int, rows: int, what: str) -> int:
            part = g.transpose(g.narrow(w, 0, index * e, e), [1, 0], name=f"{p}.attention.{what}_weight_t")
            y = g.add(g.matmul(value, part), g.narrow(bias, 0, index * e, e), name=f"{p}.attention.{what}")
            return self.split_heads(y, b, rows, h, d, f"{p}.attention.{what}")

        q, k, v = project(probe, 0, 1, "q"), project(x, 1, n, "k"), project(x, 2, n, "v")
        a = self.merge_heads(self.attend(q, k, v, mask, f"{p}.attention"), b, 1, e, f"{p}.attention")
        a = self.linear(a, f"{p}.attention.out_proj", e, e, True)
        y = g.add(a, self.mlp(self.norm(a, f"{p}.layernorm"), f"{p}.mlp"), name=f"{p}.residual")
        return g.reshape(y, [b, e], name=f"{p}.pooled")

    # ------------------------------------------------------------------ shared
    def attend(self, q: int, k: int, v: int, mask: int | None, name: str) -> int:
        h, d = self.spec.num_heads, self.spec.hidden_size // self.spec.num_heads
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", AmbiguousLayoutWarning)  # [B, H, S, D] by construction
            if mask is None:
                return self.g.attention_kind(q, k, v, h, d, "none", name=name)
            return self.g.attention(q, k, v, mask, h, d, name=name)

    def attention(self, x: int, q_name: str, k_name: str, v_name: str, bias: bool, name: str, mask: int | None) -> int:
        s, o = self.spec, self.options
        b, e, h, n = o.batch_size, s.hidden_size, s.num_heads, o.tokens(s)
        d = e // h
        q, k, v = (self.split_heads(self.linear(x, m, e, e, bias), b, n, h, d, m) for m in (q_name, k_name, v_name))
        return self.merge_heads(self.attend(q, k, v, mask, name), b, n, e, name)

    def build(self) -> Graph:
        s, o, g = self.spec, self.options, self.g
        b, e, r = o.batch_size, s.hidden_size, s.root
        if s.layout == "dinov2":
            x = self.dinov2_embeddings()
            for i in range(s.num_layers):
                x = self.dinov2_layer(x, f"encoder.layer.{i}")
            x = self.norm(x, "layernorm")
            pooled = g.reshape(g.narrow(x, 1, 0, 1), [b, e], name="pooler") if o.pooled else None
        else:
            x, mask = self.siglip_embeddings(r)
            for i in range(s.num_layers):
                x = self.siglip_layer(x, f"{r}encoder.layers.{i}", mask)
            x = self.norm(x, f"{r}post_layernorm")
            pooled = self.pooling_head(x, f"{r}head", mask) if o.pooled else None
        if pooled is None:
            g.set_name(x, "last_hidden_state")
            g.set_outputs([x])
            return g
        if o.normalize:
            norm = g.sqrt(g.sum(g.mul(pooled, pooled, name="normalize.square"), 1, keep_dim=True), name="normalize.norm")
            pooled = g.div(pooled, g.maximum(norm, self.scalar(1e-12), name="normalize.floor"), name="normalize")
        g.set_name(pooled, "image_embeds" if o.normalize else "pooler_output")
        g.set_outputs([pooled])
        return g


def build_vision(spec: VisionSpec, options: VisionOptions, name: str | None = None,
                 ) -> tuple[Graph, dict[str, tuple[int, ...]], dict[str, np.ndarray]]:
    """The graph, the checkpoint tensors it reads (name -> shape), and no computed arrays."""
    options.validate(spec)
    if options.pooled and spec.layout == "siglip" and not spec.use_head:
        raise InvalidOptionError(f"{spec.family}: this vision tower has no pooling head (vision_use_head false), so it has"
                                 " no pooler_output; build last_hidden_state (pooling=None)")
    builder = _Builder(spec, options, name or f"{spec.family}_vision")
    return builder.build(), builder.expected, {}


def vision_options(spec: VisionSpec, *, batch_size: int, seq_len: int | None, image_size: object,
                   spatial_shape: object, pooling: str | None, normalize: bool) -> VisionOptions:
    """VisionOptions from `from_pretrained`'s keyword arguments."""
    if pooling not in ("auto", None):
        raise InvalidOptionError(f"{spec.family} pools as its model does: pooling 'auto' (pooler_output) or None"
                                 f" (last_hidden_state), got {pooling!r}")
    return VisionOptions(
        batch_size=batch_size, image_size=_pair(image_size, "image_size"),
        num_patches=seq_len, spatial_shape=_pair(spatial_shape, "spatial_shape"),
        pooled=pooling == "auto", normalize=normalize,
    )
