"""A Hugging Face decoder checkpoint -> one deployable stateful package (docs/llm.md):
prefill buckets and decode as functions sharing the weights and the KV-cache state.

Every function is the checkpoint's decode graph (upstream's decode form) built for its number
of new tokens, with RoPE tables of `max_context` rows so that all functions share them; the
stateful conversion then turns the past K/V inputs into the state.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rlx_mil.errors import InvalidOptionError


def prefill_buckets(text: str | Sequence[int] | None, max_context: int) -> list[int]:
    """Parse `--prefill 64,512` (or a list) into sorted distinct bucket lengths, each in
    [2, max_context - 1] (one token is the decode function's job)."""
    if text is None or text == "":
        return []
    if isinstance(text, str):
        try:
            items = [int(t) for t in text.replace(" ", "").split(",") if t]
        except ValueError:
            raise InvalidOptionError(f"--prefill takes comma-separated token counts, got {text!r}") from None
    else:
        items = list(text)
    for n in items:
        if isinstance(n, bool) or not isinstance(n, int) or not 2 <= n < max_context:
            raise InvalidOptionError(f"a prefill bucket must be an int in [2, max_context - 1 = {max_context - 1}], got {n!r}")
    return sorted(set(items))


def convert_llm_checkpoint(
    model_dir: str | os.PathLike[str],
    output: str | os.PathLike[str] | None = None,
    *,
    max_context: int,
    prefill: str | Sequence[int] | None = (),
    overwrite: bool = False,
    attention_mask: bool = False,
    **convert_options: Any,
) -> Any:
    """Build decode (and `prefill_<n>`) graphs from the checkpoint and convert them into one
    stateful multifunction package (`rlx_mil.convert_functions`); returns its MLModel and
    writes it to `output` when given. `convert_options` are `rlx_mil.convert`'s (target,
    precision, compute_units, attention, cache_layout)."""
    from rlx_mil.lower.multifunction import convert_functions
    from rlx_mil.models.pretrained import from_pretrained

    if isinstance(max_context, bool) or not isinstance(max_context, int) or max_context < 2:
        raise InvalidOptionError(f"max_context must be an int >= 2, got {max_context!r}")
    buckets = prefill_buckets(prefill, max_context)
    if attention_mask and buckets:
        raise InvalidOptionError("a key-padding attention_mask is only built for the one-token decode graph; drop the prefill buckets")

    def graph(new_tokens: int) -> Any:
        return from_pretrained(
            model_dir, "decode", seq_len=new_tokens, cache_len=1, max_positions=max_context, last_logits=True,
            attention_mask=attention_mask and new_tokens == 1,
        )

    decode, params = graph(1)
    functions: dict[str, Any] = {f"prefill_{n}": graph(n)[0] for n in buckets}
    functions["decode"] = decode
    return convert_functions(
        functions, params, kv_cache="auto", max_context=max_context, default_function="decode",
        path=None if output is None else Path(output), overwrite=overwrite, **convert_options,
    )


def reference_greedy(
    model_dir: str | os.PathLike[str], prompt: Sequence[int], steps: int, compression: Any = None
) -> list[int]:
    """Greedy tokens of the checkpoint's plain (stateless) graph run by the NumPy reference over
    the whole sequence at every step: what a stateful package must reproduce. `compression`
    (the package's `CompressionReport`) makes the reference use the dequantized weights."""
    import numpy as np

    from rlx_mil.models.pretrained import from_pretrained
    from rlx_mil.reference import evaluate

    tokens = list(prompt)
    for _ in range(steps):
        graph, params = from_pretrained(model_dir, "prefill", seq_len=len(tokens), last_logits=True)
        if compression is not None:
            from rlx_mil.compress import dequantized_params

            params = dequantized_params(params, compression)
        logits = evaluate(graph, {"input_ids": np.asarray([tokens], np.int32)}, params)["logits"]
        tokens.append(int(np.argmax(logits.reshape(-1, logits.shape[-1])[-1])))
    return tokens[len(prompt):]


def add_arguments(p: Any) -> None:
    """The convert-hf flags that make a stateful package."""
    p.add_argument("--stateful", action="store_true",
                   help="decoders: one stateful package (KV cache as Core ML state) with the prefill buckets and"
                        " decode as functions sharing the weights (docs/llm.md)")
    p.add_argument("--max-context", type=int, default=2048, help="--stateful: cache capacity in tokens (default 2048)")
    p.add_argument("--prefill", default="", metavar="N,N,...", help="--stateful: prefill bucket lengths, e.g. 64,512")
    p.add_argument("--cache-layout", default="stacked", choices=["stacked", "per_layer"],
                   help="--stateful: two stacked states (default) or one state per layer's K and V")


def run_stateful(args: Any, convert_options: dict[str, Any]) -> int:
    """`convert-hf --stateful`: build, convert and save the package; `--verify` checks that the
    MIL executor generates the reference's greedy tokens."""
    import time

    from rlx_mil.generate import Session
    from rlx_mil.models.convert_hf import check_output
    from rlx_mil.package_info import package_info

    own_graph_flags = {
        "--variant decode": args.variant == "decode", "--seq-len": args.seq_len is not None,
        "--cache-len": args.cache_len is not None, "--kv-outputs": args.kv_outputs,
        "--last-logits": args.last_logits, "--position-ids": args.position_ids,
        "--max-positions": args.max_positions is not None, "--save-graph": args.save_graph is not None,
        "--batch-size": args.batch_size != 1,
    }
    clashing = [flag for flag, given in own_graph_flags.items() if given]
    if clashing:
        raise InvalidOptionError(
            f"--stateful builds its own decode graphs (one per prefill bucket and decode, sized by --max-context);"
            f" drop {', '.join(clashing)}"
        )
    check_output(args.output, args.overwrite)
    start = time.perf_counter()
    convert_llm_checkpoint(
        args.model_dir, args.output, max_context=args.max_context, prefill=args.prefill,
        overwrite=args.overwrite, cache_layout=args.cache_layout, attention_mask=args.attention_mask,
        **convert_options,
    )
    info = package_info(args.output)
    names = ", ".join(info.functions)
    print(f"wrote {args.output} (functions {names}; {info.weight_bytes} bytes of weights) in {time.perf_counter() - start:.1f} s")
    if args.verify:
        exact = args.precision == "fp32"
        session = Session(args.output, engine="milexec", precision_model="float32" if exact else "declared")
        prompt = [1 + (7 * i) % (session.vocab - 1) for i in range(5)]
        got = session.generate(prompt, 8)
        from rlx_mil.compress import report_of

        want = reference_greedy(args.model_dir, prompt, 8, report_of(info.metadata))
        verdict = "ok" if got == want else "MISMATCH"
        print(f"verify: greedy tokens after prompt {prompt}: package {got}, reference {want}: {verdict}")
        return 0 if got == want else 1
    return 0
