"""Lowering a planned KV cache (`rlx_mil.lowering.state.kv_cache.KVCachePlan`) into one MIL function:
the state placeholders, one `slice_update` + `coreml_update_state` per cache per call, and the
attention that reads the whole cache capacity under a mask built from `cache_position`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import numpy as np

from rlx_mil.errors import ConversionError
from rlx_mil.ir.attention_layout import attention_geometry
from rlx_mil.ir.graph import Graph, Node
from rlx_mil.ir.ops import Attention, MaskType
from rlx_mil.ir.shape import Shape, Static
from rlx_mil.lowering.state.kv_cache import POSITION_INPUT, KVCachePlan, attention_of
from rlx_mil.lowering.state.recurrent_state import read_states, write_states
from rlx_mil.lowering.target import Precision


class KVCacheLowering:
    """Emits the state reads/writes and the cache-reading attention for one MIL function."""

    def __init__(self, plan: KVCachePlan, graph: Graph, precision: Precision) -> None:
        self.plan = plan
        self.graph = graph
        self.precision = precision
        self.pairs = {p.concat_id: p for p in plan.pairs}
        self.attention_ids = {a for p in plan.pairs for a in p.attention_ids}
        self.position: Any = None
        self.state_vars: dict[str, Any] = {}
        self._latest: dict[str, Any] = {}  # state name -> the value last written
        self._masks: dict[Any, Any] = {}

    # -- interface ----------------------------------------------------------------------------
    def reserved_names(self) -> list[str]:
        return [POSITION_INPUT, *(s.name for s in self.plan.states())] if self.plan.pairs else [s.name for s in self.plan.states()]

    def placeholders(self) -> dict[str, Any]:
        """The write-position input and one fp16 state per cache (or per stacked cache)."""
        from coremltools.converters.mil import Builder as mb
        from coremltools.converters.mil.mil import types

        made: dict[str, Any] = {}
        if self.plan.pairs:
            made[POSITION_INPUT] = mb.placeholder(shape=(1,), dtype=types.int32, name=POSITION_INPUT)
        for spec in self.plan.states():
            made[spec.name] = mb.state_tensor_placeholder(shape=spec.shape, dtype=types.fp16)
        return made

    def input_shape(self, node: Node) -> tuple[int, ...]:
        if node.id in self.plan.mask_inputs:
            return self.plan.mask_inputs[node.id]
        return node.shape.sizes() or (1,)

    def bind(self, func: Any) -> None:
        self.position = func.inputs.get(POSITION_INPUT)
        self.state_vars = {s.name: func.inputs[s.name] for s in self.plan.states()}

    def read_recurrent(self, env: dict[int, Any], name: Any) -> None:
        read_states(self.plan.recurrent, self.state_vars, self.precision, env, name)

    def write_recurrent(self, published: Mapping[tuple[int, int], Any], var_of: Any, name: Any) -> None:
        write_states(self.plan.recurrent, self.state_vars, self.precision, published, var_of, name)

    def overrides(self) -> dict[int, Any]:
        """Node id -> rule replacing the node's own lowering."""
        rules: dict[int, Any] = {cid: self.lower_cache_concat for cid in self.pairs}
        rules.update({aid: self.lower_cached_attention for aid in self.attention_ids})
        return rules

    # -- cache write and read -----------------------------------------------------------------
    def _int_vector(self, parts: list[Any], ctx: Any, what: str) -> Any:
        from coremltools.converters.mil import Builder as mb

        values = [np.array([p], np.int32) if isinstance(p, int) else p for p in parts]
        return mb.concat(values=values, axis=0, name=ctx.name(what))

    def lower_cache_concat(self, ctx: Any) -> Any:
        """Write the new rows at `cache_position`; return the whole cache `[B, H_kv, C, D]`."""
        from coremltools.converters.mil import Builder as mb

        from rlx_mil.lowering.rules.attention_masks import split_heads

        pair = self.pairs[ctx.node.id]
        dims = self._dims(self.graph.node(pair.attention_ids[0]))
        new = split_heads(ctx.var(1), dims, dims.num_kv_heads, pair.new_rows, ctx, f"{pair.role}_rows")
        if self.precision is Precision.FP32:
            new = mb.cast(x=new, dtype="fp16", name=ctx.name("rows_fp16"))
        b, h, c, d, n = pair.batch, pair.kv_heads, self.plan.max_context, pair.head_dim, pair.new_rows
        pos = self.position
        end_pos = mb.add(x=pos, y=np.int32(n), name=ctx.name("end_position"))
        state_name = pair.state_name(self.plan.layout)
        current = self._latest.get(state_name)
        if current is None:
            current = mb.read_state(input=self.state_vars[state_name], name=ctx.name("read_state"))
        if self.plan.layout == "stacked" and self.plan.rank4:
            begin = self._int_vector([pair.layer * b, 0, pos, 0], ctx, "write_begin")
            end = self._int_vector([(pair.layer + 1) * b, h, end_pos, d], ctx, "write_end")
            rows = new
        elif self.plan.layout == "stacked":
            layer = pair.layer
            begin = self._int_vector([layer, 0, 0, pos, 0], ctx, "write_begin")
            end = self._int_vector([layer + 1, b, h, end_pos, d], ctx, "write_end")
            rows = mb.expand_dims(x=new, axes=[0], name=ctx.name("rows_stacked"))
        else:
            begin = self._int_vector([0, 0, pos, 0], ctx, "write_begin")
            end = self._int_vector([b, h, end_pos, d], ctx, "write_end")
            rows = new
        updated = mb.slice_update(x=current, update=rows, begin=begin, end=end, name=ctx.name("cache_write"))
        written = mb.coreml_update_state(state=self.state_vars[state_name], value=updated, name=ctx.name("cache_state"))
        self._latest[state_name] = written
        cache = written
        if self.plan.layout == "stacked" and self.plan.rank4:
            cache = mb.slice_by_index(
                x=written, begin=[pair.layer * b, 0, 0, 0], end=[(pair.layer + 1) * b, h, c, d],
                name=ctx.name("cache_layer"),
            )
        elif self.plan.layout == "stacked":
            cache = mb.slice_by_index(
                x=written, begin=[pair.layer, 0, 0, 0, 0], end=[pair.layer + 1, b, h, c, d],
                squeeze_mask=[True, False, False, False, False], name=ctx.name("cache_layer"),
            )
        if self.precision is Precision.FP32:
            cache = mb.cast(x=cache, dtype="fp32", name=ctx.name("cache_fp32"))
        return cache

    def _dims(self, attention: Node) -> Any:
        op = attention.op
        assert isinstance(op, Attention)
        shapes = [self.graph.node(attention.inputs[i]).shape for i in range(3)]
        geo = attention_geometry(shapes[0], shapes[1], shapes[2], op.num_heads, op.head_dim)
        return dataclasses.replace(geo, kv_len=Static(self.plan.max_context))

    # -- masks ----------------------------------------------------------------------------------
    def _written(self, ctx: Any, n: int) -> Any:
        """Bool `[C]`: the slots holding a key after this call's write (slot < position + n)."""
        from coremltools.converters.mil import Builder as mb

        key = ("written", n)
        if key not in self._masks:
            slots = np.arange(self.plan.max_context, dtype=np.int32)
            end = mb.add(x=self.position, y=np.int32(n), name=ctx.name("written_end"))
            self._masks[key] = mb.less(x=slots, y=end, name=ctx.name("slots_written"))
        return self._masks[key]

    def _window_keep(self, ctx: Any, dims: Any, window: int | None) -> Any:
        """Bool `[G*Sq, C]`: folded query row g*Sq + i (at position `cache_position + i`) sees
        slot j when j <= position + i (and j >= position + i - window)."""
        from coremltools.converters.mil import Builder as mb

        key = ("window", dims.group_size, dims.q_size, window)
        if key in self._masks:
            return self._masks[key]
        rows = np.tile(np.arange(dims.q_size, dtype=np.int32), dims.group_size).reshape(dims.rows, 1)
        row_pos = mb.add(x=self.position, y=rows, name=ctx.name("row_positions"))
        slots = np.arange(self.plan.max_context, dtype=np.int32)
        keep = mb.less_equal(x=slots, y=row_pos, name=ctx.name("mask_causal"))
        if window is not None:
            oldest = mb.sub(x=row_pos, y=np.int32(window), name=ctx.name("window_oldest"))
            recent = mb.greater_equal(x=slots, y=oldest, name=ctx.name("mask_recent"))
            keep = mb.logical_and(x=keep, y=recent, name=ctx.name("mask_window"))
        self._masks[key] = keep
        return keep

    def _masking(self, node: Node, dims: Any, ctx: Any) -> tuple[Any, Any, Any]:
        """(keep mask, live-rows flag or None, fallback mask for rows with no visible key)."""
        from coremltools.converters.mil import Builder as mb

        kind = attention_of(node).mask_kind
        if kind.type is MaskType.CAUSAL:
            return self._window_keep(ctx, dims, None), None, None
        if kind.type is MaskType.SLIDING_WINDOW:
            return self._window_keep(ctx, dims, kind.window), None, None
        written = self._written(ctx, dims.q_size)
        if kind.type is MaskType.NONE:
            return written, None, None
        assert kind.type is MaskType.CUSTOM
        mask_shape: Shape = self.graph.node(node.inputs[3]).shape
        key = ("custom", node.inputs[3])
        if key not in self._masks:
            raw = mb.reshape(x=ctx.var(3), shape=[dims.batch_size, 1, 1, self.plan.max_context], name=ctx.name("mask_slots"))
            if mask_shape.dtype.is_float:
                flags = mb.greater_equal(x=raw, y=ctx.scalar(0.5), name=ctx.name("mask_flags"))
            elif mask_shape.dtype.is_int:
                flags = mb.greater_equal(x=raw, y=np.int32(1), name=ctx.name("mask_flags"))
            else:
                flags = raw
            keep = mb.logical_and(x=flags, y=written, name=ctx.name("mask_keep"))
            kept = mb.cast(x=keep, dtype=ctx.mil_float, name=ctx.name("mask_kept"))
            any_kept = mb.reduce_max(x=kept, axes=[-1], keep_dims=True, name=ctx.name("mask_any_kept"))
            live = mb.greater(x=any_kept, y=ctx.scalar(0.5), name=ctx.name("mask_live_rows"))
            self._masks[key] = (keep, live)
        keep, live = self._masks[key]
        return keep, live, written

    # -- attention ------------------------------------------------------------------------------
    def lower_cached_attention(self, ctx: Any) -> Any:
        from coremltools.converters.mil import Builder as mb

        from rlx_mil.lowering.rules.attention import score_scale_factor, use_fused
        from rlx_mil.lowering.rules.attention_masks import (
            fold_groups,
            merge_heads,
            split_heads,
            unfold_groups,
        )

        node = ctx.node
        op = node.op
        dims = self._dims(node)
        q = split_heads(ctx.var(0), dims, dims.num_heads, dims.q_size, ctx, "q")
        q = fold_groups(q, dims, ctx, "q")
        k, v = ctx.var(1), ctx.var(2)
        if tuple(k.shape) != (dims.batch_size, dims.num_kv_heads, dims.kv_size, dims.head_dim):
            raise ConversionError(f"node %{node.id}: cached k has shape {k.shape}, expected the cache layout")
        keep, live, fallback = self._masking(node, dims, ctx)
        if live is not None:
            # A row whose key-padding mask hides every written key averages the written keys,
            # as the stateless graph does over its P+n keys: unmask them and zero the query.
            dead = mb.logical_not(x=live, name=ctx.name("mask_dead_rows"))
            revive = mb.logical_and(x=dead, y=fallback, name=ctx.name("mask_revived"))
            keep = mb.logical_or(x=keep, y=revive, name=ctx.name("mask_keep_live"))
            q = mb.select(cond=live, a=q, b=ctx.scalar(0.0), name=ctx.name("q_live"))
        if use_fused(op, ctx):
            factor = score_scale_factor(op)
            if factor is not None:
                q = mb.mul(x=q, y=ctx.scalar(factor), name=ctx.name("q_scaled"))
            out = mb.scaled_dot_product_attention(query=q, key=k, value=v, attn_mask=keep, name=ctx.name("sdpa"))
        else:
            from rlx_mil.lowering.rules.attention import attention_probabilities
            from rlx_mil.lowering.rules.attention_masks import Masking

            probs = attention_probabilities(q, k, float(op.scale), op.softcap, Masking(keep=keep), ctx)
            out = mb.matmul(x=probs, y=v, name=ctx.name("context"))
        out = unfold_groups(out, dims, ctx, "out")
        return merge_heads(out, dims, dims.num_heads, dims.q_size, ctx.out_shape.sizes(), ctx, "out")
