"""Upstream RLX's serde JSON form: field codecs, the op table, reader and writer.

The public API is `rlx_mil.ir.json_io` and `Graph.from_json` / `Graph.to_json`.
"""
