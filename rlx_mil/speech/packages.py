"""A Whisper checkpoint folder -> the folder of packages WhisperKit loads.

`openai_whisper-<variant>/` holds `MelSpectrogram.mlpackage` (`audio [480000]` ->
`melspectrogram_features [1, n_mels, 1, 3000]`), `AudioEncoder.mlpackage` (->
`encoder_output_embeds [1, d_model, 1, 1500]`), `TextDecoder.mlpackage` (WhisperKit's one-token
decoder over a caller-held cache of `cache_len` slots; argmaxinc/whisperkittools
`text_decoder.py`), and beside them `config.json`, `generation_config.json` and the tokenizer
files. Under fp16 the float inputs and outputs are fp16 and the update mask int32, as WhisperKit
(`TextDecoder.swift`, `prepareDecoderInputs`) makes its arrays. `stateful=True` writes
`TextDecoderStateful.mlpackage` beside them (rlx_mil's own form; `rlx_mil.speech.stateful`).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from rlx_mil import interrupts
from rlx_mil.errors import InvalidOptionError
from rlx_mil.ir import Graph
from rlx_mil.models.whisper import check_cache_len
from rlx_mil.models.whisper_checkpoint import (
    TOKENIZER_FILES,
    WhisperCheckpoint,
    hf_config_of,
    open_whisper,
)
from rlx_mil.progress import Progress
from rlx_mil.speech.graphs import graphs
from rlx_mil.speech.model import DECODER, ENCODER, MEL, STATEFUL_DECODER
from rlx_mil.units import counted

if TYPE_CHECKING:
    from rlx_mil.compress import CompressionConfig
    from rlx_mil.speech.calibration import SpeechCalibration
    from rlx_mil.speech.evaluate import SpeechEvalResult

#: WhisperKit's decoder cache, `Constants.maxTokenContext`: 448 / 2 slots (the default
#: `cache_len` is half the checkpoint's `max_target_positions`).
DEFAULT_CACHE_LEN = 224
#: The metadata key naming a package's part of the folder.
ROLE_KEY = "rlx_mil.whisper.role"


@dataclass(frozen=True)
class WhisperPackages:
    """A written WhisperKit folder."""

    folder: Path
    packages: dict[str, Path]
    cache_len: int
    precision: str
    #: The compressed folder's quality against the float checkpoint (`rlx_mil.speech.quality_check`);
    #: None when nothing was compressed or the check was not asked for.
    quality: SpeechEvalResult | None = None
    #: Each compressed package's compression report, by role.
    reports: dict[str, Any] = field(default_factory=dict)


def folder_name(directory: Path) -> str:
    """WhisperKit's folder name for a checkpoint folder: `openai_whisper-<variant>`."""
    name = directory.resolve().name.lower()
    name = re.sub(r"^(openai[_-]|faster-|ct2-)", "", name)
    name = re.sub(r"(-ct2|-ctranslate2|-hf)$", "", name)
    if not name.startswith(("whisper", "distil-whisper")):
        name = f"whisper-{name}"
    return f"openai_{name}"


def convert_whisper(
    model_dir: str | os.PathLike[str],
    output_dir: str | os.PathLike[str],
    *,
    precision: str = "fp16",
    target: str = "iOS17",
    compress: Any = None,
    deploy: str = "plain",
    cache_len: int | None = None,
    stateful: bool = False,
    overwrite: bool = False,
    name: str | None = None,
    calibration: Sequence[str | os.PathLike[str]] | None = None,
    progress: Progress | None = None,
    on_graph: Callable[[str, Graph, Mapping[str, Any], Path], None] | None = None,
    quality_check: bool | None = None,
) -> WhisperPackages:
    """Write the WhisperKit folder of the Whisper checkpoint `model_dir` (Hugging Face or
    CTranslate2 layout) into `output_dir/openai_whisper-<variant>` (`name` overrides the folder
    name). `compress` applies to the encoder and decoder weights (the mel front end has only its
    DFT basis and filter bank, kept exact); the mel front end follows `precision` (its log is
    taken so that an fp16 program floors silence at -10 as Whisper does).
    `on_graph(role, graph, params, package)` is called after each package is saved (`--verify`).
    With `compress` autoN, one plan covers the encoder's and decoder's weights
    (`rlx_mil.speech.folder_plan`), measured on the audio files `calibration` (else the built-in
    calibration clip, another than the check's). A compressed folder's quality is measured against the checkpoint on
    `calibration` (else the built-in English speech clip) once it is written
    (`rlx_mil.speech.quality_check`; `WhisperPackages.quality`), warning below the documented
    thresholds; `quality_check` False skips it, None runs it unless the config says `check=off`."""
    if precision not in ("fp16", "fp32"):
        raise InvalidOptionError(f"precision must be 'fp16' or 'fp32', got {precision!r}")
    progress = progress or Progress(enabled=False)
    progress.begin("reading the checkpoint")
    checkpoint = open_whisper(model_dir)
    if cache_len is None:  # WhisperKit's 224 for Whisper's 448 positions
        cache_len = checkpoint.spec.max_target_positions // 2
    check_cache_len(checkpoint.spec, cache_len)
    from rlx_mil.speech.calibration import speech_calibration

    heard = speech_calibration(calibration)  # the files read (and refused) before any conversion
    progress.end(f"Whisper ({checkpoint.layout} layout): d_model {checkpoint.spec.d_model},"
                 f" {checkpoint.spec.encoder_layers} + {counted(checkpoint.spec.decoder_layers, 'layer')},"
                 f" {checkpoint.spec.num_mel_bins} mels")
    folder = Path(output_dir) / (name or folder_name(checkpoint.directory))
    if folder.exists() and not overwrite:
        raise InvalidOptionError(f"{folder} exists; pass --overwrite to replace it")
    # Written into a staging folder beside the destination and renamed into place at the end:
    # a failed or killed conversion leaves the old folder (or none), never a partial one; the
    # staging folders of killed conversions (their process gone) are removed here.
    folder.parent.mkdir(parents=True, exist_ok=True)
    _sweep_staging(folder)
    staging = Path(tempfile.mkdtemp(prefix=f".{folder.name}.rlx-staging-{os.getpid()}-", dir=folder.parent))
    try:
        written = _write_packages(checkpoint, staging, folder, precision=precision, target=target, compress=compress,
                                  deploy=deploy, cache_len=cache_len, stateful=stateful, progress=progress,
                                  on_graph=on_graph, calibration=heard)
        write_folder_files(checkpoint, staging)
        reports = _reports(staging, written)
        quality = None
        if reports and _checks(compress, quality_check):
            quality = _measure_quality(staging, checkpoint, calibration, compress, reports, progress)
        staging.chmod(0o777 & ~_umask())
        interrupts.check()  # a Ctrl-C a library swallowed: nothing is installed
        if folder.exists():
            shutil.rmtree(folder)
        staging.rename(folder)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    return WhisperPackages(folder, written, cache_len, precision, quality, reports)


def _reports(staging: Path, written: Mapping[str, Path]) -> dict[str, Any]:
    """The compression report of each package that compressed a weight, by role."""
    from rlx_mil.compress import report_of
    from rlx_mil.coreml.package_info import package_info

    found = {}
    for role, path in written.items():
        report = report_of(package_info(staging / path.name).metadata)
        if report is not None and report.weights:
            found[role] = report
    return found


def _checks(compress: Any, asked: bool | None) -> bool:
    from rlx_mil.compress import parse_compress

    if asked is not None:
        return asked
    config = parse_compress(compress)
    return config is None or config.check is not False


def _measure_quality(staging: Path, checkpoint: WhisperCheckpoint, calibration: Sequence[str | os.PathLike[str]] | None,
                     compress: Any, reports: Mapping[str, Any], progress: Progress) -> SpeechEvalResult:
    """The written folder against the float checkpoint (`rlx_mil.speech.quality_check`), with
    its warning when a threshold is crossed."""
    from rlx_mil.compress import parse_compress
    from rlx_mil.compress.quality import DEFAULT_THRESHOLDS
    from rlx_mil.compress.quality_check import warn_below_threshold
    from rlx_mil.speech.quality_check import folder_quality

    config = parse_compress(compress)
    thresholds = config.thresholds if config is not None else DEFAULT_THRESHOLDS
    progress.begin("measuring the quality against the float checkpoint", min_seconds=1.0)
    result = folder_quality(staging, checkpoint.directory, calibration, reports=reports, thresholds=thresholds)
    progress.end()
    for check in result.checks:
        warn_below_threshold(check, stacklevel=4)
    return result


def _sweep_staging(folder: Path) -> None:
    for stale in folder.parent.glob(f".{folder.name}.rlx-staging-*"):
        pid = stale.name.rsplit(".rlx-staging-", 1)[1].split("-", 1)[0]
        if not pid.isdigit() or not stale.is_dir() or stale.is_symlink():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            shutil.rmtree(stale, ignore_errors=True)
        except (PermissionError, OverflowError):
            continue


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _write_packages(checkpoint: WhisperCheckpoint, staging: Path, folder: Path, *, precision: str, target: str,
                    compress: Any, deploy: str, cache_len: int, stateful: bool, progress: Progress,
                    on_graph: Callable[[str, Graph, Mapping[str, Any], Path], None] | None,
                    calibration: SpeechCalibration) -> dict[str, Path]:
    """Convert and save the packages into `staging`; returns their paths in `folder` (where
    they will be once the staging folder is renamed)."""
    from rlx_mil import api

    fp16_io = precision == "fp16"
    written: dict[str, Path] = {}
    built = graphs(checkpoint, cache_len, fp16_io)
    compress = folder_compression(compress, deploy, [built[ENCODER][0], built[DECODER][0]])
    config = _auto_config(compress, deploy)
    if config is not None:  # autoN: one plan over both packages' weights
        from rlx_mil.speech.folder_plan import plan_folder

        progress.begin(f"planning auto{config.auto} across the packages")
        compress = plan_folder(config, checkpoint, built, calibration, target=target, precision=precision)
        progress.end(compress.plan.summary.split(" (one budget")[0])
    compress = _folder_checked(compress, deploy)
    for role, (graph, params) in built.items():
        progress.begin(f"converting {role}")
        # WhisperKit reads one `logits` output: the Neural Engine form keeps it whole (split_logits)
        model = api.convert(graph, params, precision=precision, target=target, deploy=deploy,
                            compress=None if role == MEL else compress, fp16_io=fp16_io, split_logits=False)
        _describe(model, role, checkpoint)
        path = api.save(model, staging / f"{role}.mlpackage", overwrite=True)
        del model
        progress.end(str(folder / path.name))
        written[role] = folder / path.name
        if on_graph is not None:
            on_graph(role, graph, params, path)
    if stateful:
        from rlx_mil.speech.stateful import convert_stateful_decoder

        progress.begin(f"converting {STATEFUL_DECODER}")
        convert_stateful_decoder(checkpoint, staging / f"{STATEFUL_DECODER}.mlpackage", precision=precision,
                                 compress=compress, deploy=deploy, max_context=checkpoint.spec.max_target_positions // 2)
        written[STATEFUL_DECODER] = folder / f"{STATEFUL_DECODER}.mlpackage"
        progress.end(str(written[STATEFUL_DECODER]))
    return written


def folder_compression(compress: Any, deploy: str, graphs_: list[Graph]) -> Any:
    r"""`compress` for every package of the folder: rules (`re:PATTERN=SCHEME`, ...) are checked
    against the weights of all the packages together, so a rule naming only encoder weights
    (``re:^model\.encoder\.=int8``) is not refused by the decoder's package, while one that
    names no weight of any package still is. Without rules, `compress` as given."""
    import dataclasses

    from rlx_mil.compress import parse_compress
    from rlx_mil.compress.plan import param_roles, unmatched_rules
    from rlx_mil.coreml.deploy import DeployForm
    from rlx_mil.coreml.deploy.compression import form_compression

    config = parse_compress(form_compression(compress, DeployForm.parse(deploy)))
    if config is None or not config.rules:
        return compress
    roles: dict[str, str] = {}
    for graph in graphs_:
        roles.update(param_roles(graph))
    unmatched_rules(config, roles, "the speech folder")
    return dataclasses.replace(config, rules_checked=True)


def _folder_checked(compress: Any, deploy: str) -> Any:
    """`compress` with no quality check of each package's own on generated inputs: the folder
    is judged once, on speech, after it is written (`_measure_quality`)."""
    import dataclasses

    from rlx_mil.compress import parse_compress
    from rlx_mil.coreml.deploy import DeployForm
    from rlx_mil.coreml.deploy.compression import form_compression

    config = parse_compress(form_compression(compress, DeployForm.parse(deploy)))
    return None if config is None else dataclasses.replace(config, final_check=False)


def _auto_config(compress: Any, deploy: str) -> CompressionConfig | None:
    """`compress` as an autoN config a folder plan takes (the deployment form's candidates and
    budget applied), else None (not autoN, or with max_error: planned per package)."""
    from rlx_mil.compress import parse_compress
    from rlx_mil.coreml.deploy import DeployForm
    from rlx_mil.coreml.deploy.compression import form_compression

    config = parse_compress(form_compression(compress, DeployForm.parse(deploy)))
    if config is None or config.auto is None or config.max_error is not None or config.plan is not None:
        return None
    return config


def _describe(model: Any, role: str, checkpoint: WhisperCheckpoint) -> None:
    spec = checkpoint.spec
    model.short_description = {
        MEL: f"Whisper log-mel front end: 30 s of 16 kHz audio -> {spec.num_mel_bins} mel bins x 3000 frames",
        ENCODER: f"Whisper audio encoder (d_model {spec.d_model}, {counted(spec.encoder_layers, 'layer')})",
        DECODER: f"Whisper text decoder, one token per call (WhisperKit's contract; {counted(spec.decoder_layers, 'layer')})",
    }[role]
    model.user_defined_metadata[ROLE_KEY] = role


def write_folder_files(checkpoint: WhisperCheckpoint, folder: Path) -> None:
    """config.json, generation_config.json and the tokenizer files beside the packages."""
    source = checkpoint.directory
    config = hf_config_of(checkpoint.spec)
    if checkpoint.layout == "hf":
        loaded = json.loads((source / "config.json").read_text(encoding="utf-8"))
        config = loaded if isinstance(loaded, dict) else config
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    generation = dict(checkpoint.generation_config)
    if not generation:
        spec = checkpoint.spec
        generation = {"decoder_start_token_id": spec.decoder_start_token_id, "eos_token_id": spec.eos_token_id,
                      "pad_token_id": spec.pad_token_id, "suppress_tokens": list(spec.suppress_tokens),
                      "begin_suppress_tokens": list(spec.begin_suppress_tokens)}
    if checkpoint.alignment_heads and "alignment_heads" not in generation:
        generation["alignment_heads"] = [list(h) for h in checkpoint.alignment_heads]
    (folder / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n", encoding="utf-8")
    for file in TOKENIZER_FILES:
        if file in ("generation_config.json",):
            continue
        path = source / file
        if path.is_file() and not path.is_symlink():
            shutil.copyfile(path, folder / file)


def feeds_for_step(spec_kv_width: int, d_model: int, cache_len: int, token: int, position: int,
                   keys: np.ndarray, values: np.ndarray, encoded: np.ndarray) -> dict[str, np.ndarray]:
    """The TextDecoder's inputs for one step as WhisperKit builds them: the token, its
    position, the caches, the update mask (1 at `position`) and the padding mask (0 over the
    positions 0..position, -1e4 elsewhere)."""
    update = np.zeros((1, cache_len), np.int32)
    update[0, position] = 1
    padding = np.full((1, cache_len), -1e4, np.float32)
    padding[0, : position + 1] = 0
    return {"input_ids": np.array([token], np.int32), "cache_length": np.array([position], np.int32),
            "key_cache": keys, "value_cache": values, "kv_cache_update_mask": update,
            "encoder_output_embeds": encoded, "decoder_key_padding_mask": padding}
