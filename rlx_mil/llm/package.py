"""A Hugging Face decoder checkpoint -> one deployable stateful package (docs/llm.md):
prefill buckets and decode as functions sharing the weights and the KV-cache state.

Every function is the checkpoint's decode graph (upstream's decode form) built for its number
of new tokens, with RoPE tables of `max_context` rows so that all functions share them; the
stateful conversion then turns the past K/V inputs into the state.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from rlx_mil.coreml.deploy import DeployForm
from rlx_mil.errors import Fp16OverflowWarning, InvalidOptionError, RlxMilError
from rlx_mil.lowering.state.capacity import neural_engine_capacity
from rlx_mil.milexec.prepared import MemoryMode
from rlx_mil.progress import Progress
from rlx_mil.units import counted


def prefill_buckets(text: str | Sequence[int] | None, max_context: int) -> list[int]:
    """Parse `--prefill 64,512` (or a list) into sorted distinct bucket lengths, each in
    [2, max_context - 1] (one token is the decode function's job)."""
    if text is None or text == "":
        return []
    items: list[Any]
    if isinstance(text, str):
        try:
            items = [int(t) for t in text.replace(" ", "").split(",") if t]
        except ValueError:
            raise InvalidOptionError(f"--prefill takes comma-separated token counts, got {text!r}") from None
    elif isinstance(text, Sequence) and not isinstance(text, bytes):
        items = [*text]
    else:
        raise InvalidOptionError(f"prefill takes a list of bucket lengths or a string '64,512', got {text!r}")
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
    description: dict[str, str | None] | None = None,
    loader: Any = None,
    prepare: Any = None,
    progress: Progress | None = None,
    chunk_bytes: int | str | None = None,
    all_logits: bool = False,
    format: str | None = None,
    **convert_options: Any,
) -> Any:
    """Build decode (and `prefill_<n>`) graphs from the checkpoint and convert them into one
    stateful multifunction package (`rlx_mil.convert_functions`); returns its MLModel and
    writes it to `output` when given. `convert_options` are `rlx_mil.convert`'s (target,
    precision, compute_units, attention, cache_layout, compress, deploy). The package carries the checkpoint's
    tokenizer files and model description (`rlx_mil.llm.package_files`; `description`
    overrides its fields). `loader` (default `from_pretrained`) and `prepare` (default
    `prepare_package`) read another source the same way (`from_gguf` for GGUF files).
    `progress` reports each stage (reading, each function's conversion, joining, writing).
    `chunk_bytes` (an int or a size such as "1GB" or "1GiB") writes a chunked set instead: the
    folder `output` holds consecutive packages cut at layer boundaries, each weight file under
    that size, and a manifest (`rlx_mil.llm.chunked`); the `ChunkedSet` is returned.
    `all_logits` keeps every position's logits in the prefill functions (`[1, n, vocab]`, not
    the last position's only), so `rlx-mil eval` scores a bucket of tokens per call.
    `format` ("mlpackage" or "aimodel": Apple's Core AI asset, its entry points sharing one
    weight copy and the KV state; the tokenizer files inside) as for `rlx_mil.convert_functions`;
    default: `output`'s suffix."""
    from rlx_mil.api import convert_functions, save
    from rlx_mil.llm.package_files import prepare_package
    from rlx_mil.models.pretrained import from_pretrained

    if isinstance(max_context, bool) or not isinstance(max_context, int) or max_context < 2:
        raise InvalidOptionError(f"max_context must be an int >= 2, got {max_context!r}")
    if DeployForm.parse(convert_options.get("deploy", "plain")) is DeployForm.ANE:
        max_context = neural_engine_capacity(max_context)  # the RoPE tables cover the rounded capacity
    buckets = prefill_buckets(prefill, max_context)
    from rlx_mil.coreml.output_format import check_format, output_path, remember_format

    if check_format(format) == "aimodel":
        if chunk_bytes is not None:
            raise InvalidOptionError("format='aimodel' writes one asset; drop chunk_bytes")
        from rlx_mil.coreai import require

        require("format='aimodel'")
    if output is not None and chunk_bytes is None:
        output = output_path(output, format)
    if chunk_bytes is not None:
        from rlx_mil.llm.chunked import check_output_folder
        from rlx_mil.units import parse_bytes

        parse_bytes(chunk_bytes, "chunk_bytes")
        if output is None:
            raise InvalidOptionError("chunk_bytes writes a chunked set: give the output folder")
        check_output_folder(Path(output), overwrite)
    elif output is not None:
        from rlx_mil.llm.convert_hf import check_output

        check_output(Path(output), overwrite)
    if attention_mask and buckets:
        raise InvalidOptionError("a key-padding attention_mask is only built for the one-token decode graph; drop the prefill buckets")

    def graph(new_tokens: int) -> Any:
        return (loader or from_pretrained)(
            model_dir, "decode", seq_len=new_tokens, cache_len=1, max_positions=max_context,
            last_logits=not (all_logits and new_tokens > 1),
            attention_mask=attention_mask and new_tokens == 1,
        )

    stages = progress or Progress(enabled=False)
    stages.begin("reading the checkpoint")
    decode, params = graph(1)
    functions: dict[str, Any] = {f"prefill_{n}": graph(n)[0] for n in buckets}
    functions["decode"] = decode
    stages.end(f"{counted(len(functions), 'function')} ({', '.join(functions)}), {counted(len(params), 'param')}")
    if chunk_bytes is not None:
        from rlx_mil.llm.chunked import convert_chunked

        assert output is not None
        return convert_chunked(
            functions, params, output, chunk_bytes=chunk_bytes, max_context=max_context, overwrite=overwrite,
            prepare_first=lambda model: (prepare or prepare_package)(model, model_dir, description), progress=stages,
            **convert_options,
        )
    model = convert_functions(
        functions, params, kv_cache="auto", max_context=max_context, default_function="decode", progress=stages,
        **convert_options,
    )
    (prepare or prepare_package)(model, model_dir, description)
    remember_format(model, format)
    if output is not None:
        stages.begin("writing the package")
        if Path(output).suffix == ".aimodel":
            _save_asset(model, Path(output), overwrite)
        else:
            save(model, Path(output), overwrite=overwrite)
        stages.end(str(output))
    return model


def _save_asset(model: Any, output: Path, overwrite: bool) -> None:
    """A Core AI asset of the package: the package (with its tokenizer files) is written to a
    staging folder beside `output`, translated, and removed."""
    import shutil
    import tempfile

    from rlx_mil.api import save
    from rlx_mil.coreai.asset import save_aimodel

    output.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".rlx_mil_convert_", dir=output.parent))
    try:
        package = save(model, staging / (output.stem + ".mlpackage"))
        save_aimodel(package, output, overwrite=overwrite)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def reference_logits(
    model_dir: str | os.PathLike[str], tokens: Sequence[int], compression: Any = None, loader: Any = None,
    codes: dict[str, Any] | None = None, stored: Mapping[str, Any] | None = None,
) -> Any:
    """Last-position logits `[vocab]` of the checkpoint's plain (stateless) graph over `tokens`,
    run by the NumPy reference. `stored` (a saved package's `StoredWeights`, by weight name)
    replaces the weights it holds: the package's own decoded codes. Else `compression` (a
    `CompressionReport`) makes the reference use the dequantized weights: `codes` (by name) are
    decoded, the others encoded again and added to `codes`. `loader` builds the graph and params
    instead of `from_pretrained` (same signature)."""
    import numpy as np

    from rlx_mil.models.pretrained import from_pretrained
    from rlx_mil.reference import evaluate

    graph, params = (loader or from_pretrained)(model_dir, "prefill", seq_len=len(tokens), last_logits=True)
    if stored is not None:
        from rlx_mil.milexec.stored_weights import PackageParams

        params = PackageParams(params, stored)
    elif compression is not None:
        from rlx_mil.compress import dequantized_params

        params = dequantized_params(params, compression, remember=codes)
    logits = evaluate(graph, {"input_ids": np.asarray([list(tokens)], np.int32)}, params)["logits"]
    return logits.reshape(-1, logits.shape[-1])[-1]


def reference_greedy(
    model_dir: str | os.PathLike[str], prompt: Sequence[int], steps: int, compression: Any = None, loader: Any = None,
) -> list[int]:
    """Greedy tokens of the checkpoint's plain (stateless) graph run by the NumPy reference over
    the whole sequence at every step (see `reference_logits`)."""
    import numpy as np

    tokens = list(prompt)
    kept: dict[str, Any] = {}  # each compressed weight encoded once, not once per step
    for _ in range(steps):
        tokens.append(int(np.argmax(reference_logits(model_dir, tokens, compression, loader, kept))))
    return tokens[len(prompt):]


def verify_stateful(
    model_dir: str | os.PathLike[str],
    package: str | os.PathLike[str],
    prompt: Sequence[int] | None,
    steps: int,
    *,
    precision: str,
    compression: Any = None,
    memory: MemoryMode = "lean",
    report: Callable[[str], None] | None = None,
    loader: Any = None,
    opened: Callable[[], None] | None = None,
    engine: str = "milexec",
    codes: Mapping[str, Any] | None = None,
) -> Any:
    """Greedy generation of `package` on the MIL executor (`engine="coreai"`: Apple's Core AI
    runtime, fp32 compute) against the checkpoint's reference,
    tie-aware and teacher-forced (`rlx_mil.testing.compare_greedy_step`): after the prompt,
    each step compares the package's logits with the reference's over the whole sequence, then
    both go on with the reference's token (`prompt` None: 5 ids spread over the vocabulary).
    `opened` is called once the package is open on the executor, `report` with one line per
    step. With `compression` (the package's report) the reference computes with the weights the
    saved package stores, decoded from its own codes (`rlx_mil.milexec.stored_weights`; a
    chunked set's packages searched in order); `codes` is unused (kept for callers). Returns the
    `GreedyComparison`; it stops at the first step that fails."""
    import numpy as np

    from rlx_mil.llm.chunked import package_files
    from rlx_mil.llm.generate import Session
    from rlx_mil.milexec.stored_weights import StoredWeights
    from rlx_mil.testing import GreedyComparison, compare_greedy_step

    exact = precision == "fp32"
    if engine == "coreai":
        session = Session(package, engine="coreai")
        mode = "Apple's Core AI runtime, fp32 compute"
    else:
        session = Session(package, engine="milexec", precision_model="float32" if exact else "declared", memory=memory)
        mode = f"{'float32 executor' if exact else 'fp16 as declared'}, {session.memory} memory"
    if opened is not None:
        opened()
    if prompt is None:
        prompt = [1 + (7 * i) % (session.vocab - 1) for i in range(5)]
    # Each step builds the graph anew; the package's program is read once, and
    # each stored weight decoded when the reference reads it (from the session's own program where
    # it has one: the codes are not held twice).
    program = session.executor_program
    stored = None if compression is None else StoredWeights(
        package_files(package) if program is None else program, compression.weights)
    comparison = GreedyComparison(f"{Path(package).name} ({mode}) after prompt {list(prompt)}")
    tokens = list(prompt)
    logits = session.feed(tokens)
    for step in range(1, steps + 1):
        want = reference_logits(model_dir, tokens, compression, loader, stored=stored)
        if not np.isfinite(logits).all() and np.isfinite(want).all():
            warn_nonfinite_logits(package, session, tokens, step)
        result = compare_greedy_step(step, logits, want, precision)
        comparison.steps.append(result)
        if report is not None:
            report(result.to_text())
        if not result.ok:
            break
        tokens.append(result.reference_token)
        if step < steps:
            logits = session.feed([result.reference_token])
    return comparison


def warn_nonfinite_logits(package: str | os.PathLike[str], session: Any, tokens: Sequence[int], step: int) -> None:
    """An `Fp16OverflowWarning`: `session`'s logits after `tokens` hold inf/NaN where the
    reference's are finite, naming the op where they start (`first_nonfinite_op`)."""
    op = first_nonfinite_op(package, session, tokens)
    where = f"; the first op giving inf/NaN from finite inputs is {op}" if op else ""
    warnings.warn(Fp16OverflowWarning(
        f"{package}: the logits of step {step} hold inf/NaN where the reference's are finite{where}:"
        " an fp16 value passed 65,504; convert with precision='fp32'", op=op,
    ), stacklevel=3)


def first_nonfinite_op(package: str | os.PathLike[str], session: Any, tokens: Sequence[int]) -> str | None:
    """Where `tokens`, fed one by one through the package's one-token function on the executor
    (tracking non-finite values, which a Session's prepared runs do not), first give inf/NaN
    from finite inputs: "op (op_type), token i", or None (none found, or a chunked package)."""
    import numpy as np

    from rlx_mil import milexec
    from rlx_mil.lowering.state.kv_cache import POSITION_INPUT

    if session.chunked:
        return None
    fn = session.functions[-1]  # the one-token (decode) function
    io_names = session.io_names_of(fn.name)
    states: dict[str, Any] = {}
    for i, token in enumerate(tokens):
        feeds = {"input_ids": np.array([[token]], np.int32)}
        if session.contract.max_context is not None:
            feeds[POSITION_INPUT] = np.array([i], np.int32)
        if "position_ids" in fn.inputs:
            feeds["position_ids"] = np.array([[i]], np.int32)
        if "attention_mask" in fn.inputs:
            feeds["attention_mask"] = np.ones((1, session.max_context), np.float32)
        try:
            result = milexec.execute(str(package), feeds, function_name=fn.name, states=states, io_names=io_names)
        except RlxMilError:
            return None
        if result.nonfinite_origins:
            return f"{result.nonfinite_origins[0]}, token {i}"
    return None
