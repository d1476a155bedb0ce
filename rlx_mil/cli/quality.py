"""The conversion commands' quality check: `--report FILE`, `--allow-quality-loss`, the summary
line, and what `--verify` says of quality (docs/compression.md, "Quality check").

A compressed conversion measures its quality against the original model once. Stateless
conversions do it inside `rlx_mil.convert` (the compression report's `quality`, on the text
`check_inputs_of` tokenizes); stateful and GGUF conversions here, after converting, on the
checkpoint's plain graph (`rlx_mil.llm.quality_check`).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlx_mil.errors import InvalidOptionError
from rlx_mil.units import counted

if TYPE_CHECKING:  # loaded when a conversion runs, not while the command line is parsed
    import numpy as np

    from rlx_mil.compress.quality_check import QualityCheck


def add_compression_flags(p: argparse.ArgumentParser) -> None:
    """The conversion commands' compression options (`convert`, `convert-hf`, `convert-gguf`),
    the quality check's among them (`add_quality_flags`)."""
    p.add_argument("--compress", metavar="SPEC",
                   help="compress weights while converting: a preset (int8, uint8, int4, uint4, lut2, lut3, lut4, lut6,"
                   " lut8; 4bit: the --deploy form's 4-bit scheme), auto4 (also auto3, auto6, auto8: a scheme per"
                   " weight, chosen by measured error within --compress-budget) or a per-weight config such as"
                   " 'lut4;embeddings=int8;lm_head=lut6;re:v_proj=int8;min_size=4096' (docs/compression.md). Every"
                   " compressed conversion is checked against the original model and prints one quality line")
    p.add_argument("--compress-check", type=Path, metavar="INPUTS.npz",
                   help="with --compress: also convert without compression and record the output error on these"
                   " inputs in the package's compression report")
    p.add_argument("--compress-budget", type=float, metavar="FRACTION",
                   help="with --compress autoN: the weights' bytes as a fraction of their fp16 bytes, in (0, 1]"
                   " (default for auto4 0.30, with --deploy gpu 0.36, --deploy ane 0.40, a Whisper folder 0.325; auto3"
                   " 0.24, auto6 0.42, auto8 0.55; with --max-kl / --min-top1 and no --deploy gpu/ane, a decoder's"
                   " or Whisper folder's search has none and stops at the cheapest mix predicted to meet the target)")
    p.add_argument("--max-error", type=float, metavar="E",
                   help="with --compress autoN: widen every weight whose estimated relative error exceeds E")
    p.add_argument("--compress-calibration", type=Path, metavar="FILE",
                   help="calibration inputs (.npz of the graph's inputs; for convert-hf / -gguf also a .txt tokenized by"
                   " the checkpoint's / file's tokenizer; for a Whisper folder an audio file): what autoN and the quality"
                   " check measure on (default: built-in English text, or generated inputs for a model without a"
                   " tokenizer; Whisper: built-in speech clips, one to plan, one to check)")
    add_quality_flags(p)


def add_quality_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--report", type=Path, metavar="FILE.json",
                   help="with compression: write the full report (every weight's scheme, size and error; the quality"
                   " check against the original model) as JSON")
    p.add_argument("--allow-quality-loss", action="store_true",
                   help="--verify passes (exit 0) a compressed package whose quality against the original model is"
                   " below the thresholds (default KL 0.1, top-1 0.8, cosine 0.95; docs/compression.md); the warning"
                   " stays")
    p.add_argument("--max-kl", metavar="KL",
                   help="with compression: the quality target's mean KL against the original model (nats, > 0):"
                   " autoN widens weights until the mix is predicted to meet it (decoders, measured on the calibration"
                   " text), the quality check warns, and --verify fails, above it (default 0.1, which judges only)")
    p.add_argument("--min-top1", metavar="SHARE",
                   help="with compression: the quality target's teacher-forced top-1 agreement with the original"
                   " model, in (0, 1]: autoN searches toward it as --max-kl does (as the KL (2 (1 - SHARE))^2), the"
                   " check warns, and --verify fails, below it (default 0.8, which judges only)")


def quality_targets(args: argparse.Namespace) -> dict[str, Any]:
    """--max-kl / --min-top1, validated (an `InvalidOptionError` naming the option): the
    `CompressionConfig` fields they set."""
    from rlx_mil.compress.quality import check_target

    out: dict[str, Any] = {}
    for option, key in (("--max-kl", "max_kl"), ("--min-top1", "min_top1")):
        value = getattr(args, key, None)
        if value is not None:
            out[key] = check_target(option, value)
    return out


def thresholds_of(args: argparse.Namespace) -> Any:
    """The quality check's thresholds for this command: the documented ones, with the user's target."""
    from rlx_mil.compress.quality import DEFAULT_THRESHOLDS

    targets = quality_targets(args)
    return DEFAULT_THRESHOLDS.with_targets(targets.get("max_kl"), targets.get("min_top1"))


def warn_unused_targets(args: argparse.Namespace, compressed: bool) -> None:
    """One warning when --allow-quality-loss / --max-kl / --min-top1 were given to a conversion
    that compressed nothing: there is no quality check for them to act on."""
    given = [flag for flag, key in (("--allow-quality-loss", "allow_quality_loss"), ("--max-kl", "max_kl"),
                                    ("--min-top1", "min_top1")) if getattr(args, key, None) not in (None, False)]
    if given and not compressed:
        import warnings

        from rlx_mil.errors import CompressionWarning

        warnings.warn(CompressionWarning(f"{', '.join(given)}: no effect, this conversion compressed no weight"
                                         " (give --compress)"), stacklevel=2)


def user_text(args: argparse.Namespace) -> str | None:
    """The --compress-calibration text (a .txt file), else None."""
    path = getattr(args, "compress_calibration", None)
    if path is None or Path(path).suffix.lower() != ".txt":
        return None
    try:
        return Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise InvalidOptionError(f"--compress-calibration: cannot read {str(path)!r} ({err})") from None


def user_ids(args: argparse.Namespace) -> tuple[list[int], str] | None:
    """The token ids of a --compress-calibration .npz (its `input_ids`, first row), else None."""
    path = getattr(args, "compress_calibration", None)
    if path is None or Path(path).suffix.lower() != ".npz":
        return None
    import numpy as np

    from rlx_mil.compress.builtin_text import CHECK_TOKENS
    from rlx_mil.weights import open_arrays

    with open_arrays(path, "calibration file") as archive:
        if "input_ids" not in archive:
            raise InvalidOptionError(f"--compress-calibration {str(path)!r} has no 'input_ids' for the quality check")
        ids = np.asarray(archive["input_ids"])
    if ids.dtype.kind not in "iu" or ids.size < 2:
        raise InvalidOptionError(f"--compress-calibration {str(path)!r}: 'input_ids' must hold 2 or more integer token ids")
    first = ids.reshape(-1) if ids.ndim <= 1 else ids.reshape(-1, ids.shape[-1])[0]
    row = [int(i) for i in first[:CHECK_TOKENS]]
    return row, f"{counted(len(row), 'token id')} of --compress-calibration"


def check_inputs_of(model_dir: Path, args: argparse.Namespace, length: int) -> tuple[dict[str, np.ndarray], str] | None:
    """Inputs for the stateless conversion's quality check: the --compress-calibration text,
    else the built-in held-out text, tokenized by the checkpoint's tokenizer into `length`
    tokens (repeated when shorter), with its label; None without a tokenizer."""
    from rlx_mil.llm.quality_check import check_text_ids

    found = check_text_ids(model_dir, user_text(args), max_tokens=length)
    if found is None or not found[0]:
        return None
    ids, label = found
    import numpy as np

    row = np.resize(np.asarray(ids, np.int32), length)[None, :]
    if len(ids) < length:
        label += f", repeated to {length}"
    return {"input_ids": row, "attention_mask": np.ones_like(row), "token_type_ids": np.zeros_like(row)}, label


def measure_stateful(source: Any, metadata: Mapping[str, str], loader: Any, args: argparse.Namespace, *,
                     gguf: bool = False, model: Any = None, package: Any = None) -> QualityCheck | None:
    """The quality check of a stateful (or GGUF) package, with its warning: the package's
    compression against the original model on text. None when nothing was compressed (the
    caller asks only when something was encoded anew: a GGUF file's kept codes are the model).
    The compressed weights are those the saved `package` (or chunked set) stores, decoded from
    its codes; without one, the conversion's codes (`model`'s)."""
    from rlx_mil.compress import report_of
    from rlx_mil.llm.quality_check import (
        check_and_warn,
        check_text_ids,
        generated_ids,
        gguf_check_text_ids,
        measure_decoder_quality,
    )

    report = report_of(dict(metadata))
    if report is None or not report.weights:
        return None
    text = user_text(args)
    found = user_ids(args)
    if found is None:
        found = gguf_check_text_ids(source, text) if gguf else check_text_ids(source, text)
    graph_text = found is not None
    if found is None:
        vocab = _vocab(source, loader)
        found = generated_ids(vocab)
    ids, label = found
    compared = "the float model the GGUF codes decode to" if gguf else "the float checkpoint"
    codes = getattr(model, "rlx_mil_codes", None)  # the conversion's own codes: decoded, not encoded again
    stored = None
    if package is not None:  # what the saved package holds, read from it
        from rlx_mil.llm.chunked import package_files
        from rlx_mil.milexec.stored_weights import StoredWeights

        stored = StoredWeights(package_files(package), report.weights)
    from rlx_mil.progress import Progress, running_under_ci

    progress = Progress(enabled=not (getattr(args, "quiet", False) or running_under_ci()))
    progress.begin(f"measuring the quality against {compared}", min_seconds=1.0)  # a clock: minutes on a large model
    check = measure_decoder_quality(source, report, ids, label, loader=loader, compared_with=compared, text=graph_text,
                                    codes=codes, thresholds=thresholds_of(args), stored=stored)
    progress.end()
    return check_and_warn(check)


def _vocab(source: Any, loader: Any) -> int:
    graph, _ = loader(source, "prefill", seq_len=2)
    logits = next(n for n in graph if n.id in graph.outputs)
    return int(logits.shape.sizes()[-1])


def stored_check(metadata: Mapping[str, str]) -> QualityCheck | None:
    """The quality check a stateless conversion stored in the compression report."""
    from rlx_mil.compress import report_of

    report = report_of(dict(metadata))
    from rlx_mil.compress.quality_check import check_from_dict

    return None if report is None or report.quality is None else check_from_dict(report.quality)


def print_summary(check: QualityCheck | None) -> None:
    if check is not None:
        print(check.summary())


def write_report(args: argparse.Namespace, metadata: Mapping[str, str], check: QualityCheck | None) -> None:
    """--report FILE: the compression report (every weight, with the scheme it got and why) and
    the quality check as JSON. Called once after every conversion: it also warns when the
    quality options had nothing compressed to act on."""
    from dataclasses import asdict

    from rlx_mil.compress import report_of

    report = report_of(dict(metadata))
    warn_unused_targets(args, report is not None and bool(report.weights))
    path = getattr(args, "report", None)
    if path is None:
        return
    from rlx_mil.fileio import atomic_output_file

    compression = None if report is None else asdict(report)
    if compression is not None:
        compression.pop("quality", None)
    body = {"compression": compression, "quality": None if check is None else check.to_dict()}
    with atomic_output_file(Path(path), overwrite=True, what="report") as stream:
        stream.write((json.dumps(body, indent=1, allow_nan=False) + "\n").encode())
    print(f"wrote the compression report to {path}")


def check_report_path(args: argparse.Namespace) -> None:
    """Refuse a --report path that cannot be written (a folder, a missing folder, a device or
    FIFO) before any work, and one that is, or lies inside, the command's own input or output
    (a checkpoint's config.json would be replaced by the report); another existing file is
    replaced. Also refuses a bad --max-kl / --min-top1 (before any work, like the path)."""
    quality_targets(args)
    path = getattr(args, "report", None)
    if path is None:
        return
    from rlx_mil.errors import InvalidOptionError
    from rlx_mil.fileio import check_output_path

    dest = Path(path)
    check_output_path(dest, overwrite=True, what="report")
    if dest.exists() and not dest.is_file():
        raise InvalidOptionError(f"--report {dest}: not a regular file (a device or FIFO); give a file path")
    where = dest.resolve()
    for option, given in (("input", getattr(args, "model_dir", None) or getattr(args, "model", None)
                           or getattr(args, "graph", None)), ("-o", getattr(args, "output", None))):
        if given is None:
            continue
        own = Path(given).resolve()
        if where == own or own in where.parents:
            raise InvalidOptionError(f"--report {dest}: it is, or lies inside, the command's {option} {given};"
                                     " the report would replace its files")


def verify_quality(args: argparse.Namespace, check: QualityCheck | None,
                   measured: str = "the compressed weights vs the original model, NumPy reference") -> int:
    """What --verify says of quality (after the fidelity checks; `measured` says what was
    compared): 0, or 1 when the compressed package is below the thresholds and
    --allow-quality-loss was not given."""
    if check is None:
        return 0
    print(f"verify: quality ({measured}): {check.summary()}")
    if check.ok:
        return 0
    if getattr(args, "allow_quality_loss", False):
        print("verify: quality below the thresholds, accepted (--allow-quality-loss)")
        return 0
    print("verify: FAILED: quality below the thresholds (docs/compression.md); --allow-quality-loss accepts it")
    return 1


def print_compression(metadata: Mapping[str, str]) -> None:
    """The compression summary lines of a package's metadata (nothing when uncompressed)."""
    from rlx_mil.compress import report_of
    from rlx_mil.compress.report import source_summary
    from rlx_mil.units import human_bytes

    report = report_of(dict(metadata))
    if report is None:
        return
    ratio = report.bytes_after / report.bytes_before if report.bytes_before else 1.0
    count = len(report.weights)
    print(f"compressed {counted(count, 'weight')} ({report.config}): {human_bytes(report.bytes_before)} ->"
          f" {human_bytes(report.bytes_after)} ({ratio:.3f}x)")
    sources = source_summary(report.weights)
    if sources:  # what a GGUF file's tensors were, beside what they became
        print(f"  from the file's types: {sources}")
    for out, err in (report.output_error or {}).items():
        print(f"  output {out}: max |error| {err['max_abs']:.3g}, relative L2 {err['relative_l2']:.3g} vs uncompressed")
