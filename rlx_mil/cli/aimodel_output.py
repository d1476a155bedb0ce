"""`--format aimodel` (or an `-o NAME.aimodel`) on `convert`, `convert-hf` and `convert-gguf`:
the command converts as usual into a temporary `.mlpackage` beside the output (verified as
usual with `--verify`), which is then written as Apple's Core AI asset (`rlx_mil.coreai`) and
removed. `--verify --engine coreai` runs the verification of the package through Apple's Core
AI runtime instead of the MIL executor.

`--precision` is the package's precision in both formats; `--compute` is what the asset
computes in: fp32 by default (Apple's Linux runtime accumulates fp16 matmuls in fp16 and runs
fp16 5-275x slower, so fp32 is what runs and verifies here), fp16 for an asset meant for a
Mac's GPU or Neural Engine (it needs `--precision fp16`: an fp32 package's asset computes in
fp32)."""

from __future__ import annotations

import argparse
import contextlib
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TextIO

FORMATS = ("mlpackage", "aimodel")
#: What runs the package in `--verify` (`rlx_mil.models.verify.VERIFY_ENGINES`).
VERIFY_ENGINES = ("milexec", "coreai")
#: The float types a Core AI asset computes in (`--compute`).
COMPUTE_TYPES = ("fp32", "fp16")


def add_format_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument("--format", choices=FORMATS, default=None,
                   help="mlpackage (Core ML) or aimodel (Apple's Core AI asset; the coreai extra); default: the"
                        " output's suffix (an output without one gets the format's)")
    p.add_argument("--engine", choices=VERIFY_ENGINES, default="milexec",
                   help="with --verify: what runs the package against the NumPy reference: the MIL executor"
                        " (default) or Apple's Core AI runtime (the coreai extra; fp32 compute)")
    p.add_argument("--compute", choices=COMPUTE_TYPES, default=None,
                   help="with --format aimodel: the float type the asset computes in: fp32 (default; what Apple's"
                        " Linux runtime runs and verifies faithfully) or fp16 (an asset for a Mac's GPU / Neural"
                        " Engine; needs --precision fp16)")


def output_format(args: argparse.Namespace) -> str:
    """'aimodel' or 'mlpackage' from --format and the output's suffix; a contradiction between
    them is an `InvalidOptionError` naming both (`rlx_mil.coreml.output_format`)."""
    from rlx_mil.coreml.output_format import format_of_suffix, output_path

    chosen = getattr(args, "format", None)
    output = getattr(args, "output", None)
    if output is None:
        return chosen or "mlpackage"
    if chosen is not None:
        output_path(output, chosen, option="--format")  # refuses a contradiction
    return chosen or format_of_suffix(output) or "mlpackage"


def wants_aimodel(args: argparse.Namespace) -> bool:
    return output_format(args) == "aimodel"


def asset_compute(args: argparse.Namespace) -> str:
    """'fp32' or 'fp16': what the asset computes in (`--compute`, default fp32); refused with a
    typed error naming the option where it contradicts the others."""
    from rlx_mil.errors import InvalidOptionError

    chosen = getattr(args, "compute", None)
    if chosen is None:
        return "fp32"
    if not wants_aimodel(args):
        raise InvalidOptionError("--compute says what a Core AI asset computes in: add --format aimodel"
                                 " (or -o NAME.aimodel)")
    if chosen == "fp16" and getattr(args, "precision", "fp16") != "fp16":
        raise InvalidOptionError(f"--compute fp16 needs --precision fp16 (got --precision {args.precision}: an fp32"
                                 " package's asset computes in fp32)")
    return str(chosen)


def check_verify_engine(args: argparse.Namespace) -> None:
    """`--engine coreai` goes with `--verify`, needs the coreai extra and one package."""
    from rlx_mil.errors import InvalidOptionError

    if getattr(args, "engine", "milexec") != "coreai":
        return
    if not getattr(args, "verify", False):
        raise InvalidOptionError("--engine coreai says what runs --verify's checks: add --verify")
    if getattr(args, "chunk_bytes", None):
        raise InvalidOptionError("--verify --engine coreai runs one package; a chunked set (--chunk-bytes) verifies on"
                                 " the MIL executor (drop --engine coreai)")
    from rlx_mil.coreai import require

    require("--verify --engine coreai")


class _WithoutLinesStarting:
    """A text stream passing whole lines on to `stream`, except those starting with `prefix`."""

    def __init__(self, stream: TextIO, prefix: str) -> None:
        self._stream, self._prefix, self._pending = stream, prefix, ""

    def write(self, text: str) -> int:
        self._pending += text
        *lines, self._pending = self._pending.split("\n")
        for line in lines:
            if not line.startswith(self._prefix):
                self._stream.write(line + "\n")
        return len(text)

    def flush(self) -> None:
        self._stream.flush()

    def finish(self) -> None:
        """Pass on a last line that had no newline."""
        if self._pending and not self._pending.startswith(self._prefix):
            self._stream.write(self._pending)
        self._pending = ""

    def isatty(self) -> bool:
        return bool(getattr(self._stream, "isatty", lambda: False)())


def wrap(handler: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """`handler` writing a Core AI asset when the arguments ask for one."""

    def run(args: argparse.Namespace) -> int:
        check_verify_engine(args)  # before any conversion work
        compute = asset_compute(args)
        if not wants_aimodel(args):
            return handler(args)
        from rlx_mil.coreai import require
        from rlx_mil.coreai.asset import save_aimodel
        from rlx_mil.errors import ExistingFileError, InvalidOptionError

        require("--format aimodel")  # before any conversion work
        asset = Path(args.output)
        if asset.suffix != ".aimodel":
            asset = asset.with_name(asset.name + ".aimodel")
        if getattr(args, "chunk_bytes", None):
            raise InvalidOptionError("--format aimodel writes one asset; drop --chunk-bytes")
        if asset.exists() and not getattr(args, "overwrite", False):
            raise ExistingFileError(f"{asset} exists; pass --overwrite to replace it")
        asset.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=".rlx_mil_convert_", dir=asset.parent))
        try:
            args.output = staging / (asset.stem + ".mlpackage")
            filtered = _WithoutLinesStarting(sys.stdout, f"wrote {args.output}")
            try:
                with contextlib.redirect_stdout(filtered):
                    code = handler(args)  # its "wrote" line would name the hidden package
            finally:
                filtered.finish()
            if code != 0:
                return code
            # Not overwrite=True: another conversion may have written `asset` since the check above.
            save_aimodel(args.output, asset, precision=compute, overwrite=bool(getattr(args, "overwrite", False)))
            from rlx_mil.units import human_bytes

            size = sum(f.stat().st_size for f in asset.rglob("*") if f.is_file())
            print(f"wrote {asset} (Core AI asset, {human_bytes(size)}; {compute} compute)")
            if getattr(args, "verify", False):
                return verify_asset(args.output, asset, compute)
            return 0
        finally:
            args.output = asset
            shutil.rmtree(staging, ignore_errors=True)

    return run


#: Greedy steps `--verify` compares between the asset (Apple's runtime) and the package.
VERIFY_STEPS = 8


def verify_asset(package: Path, asset: Path, compute: str = "fp32") -> int:
    """`--verify` of an asset: the package was checked against the reference; the asset, run by
    Apple's Core AI runtime (`compute`: fp32, or fp16 as the Linux runtime computes it, fp16
    accumulation included), must then give the package's greedy tokens (an LLM) or its outputs
    on example inputs, the package run by the MIL executor: within 1e-4 relative for an fp32
    package; an fp16 package (which an fp32-compute asset runs in fp32, rounding only at its
    casts) within the fp16 tolerance of `rlx_mil.models.verify`."""
    import numpy as np

    from rlx_mil.coreai.asset import AssetProgram
    from rlx_mil.coreml.metadata import PRECISION, LLMContract
    from rlx_mil.coreml.package_info import package_info
    from rlx_mil.models.verify import RELATIVE_TOLERANCE

    info = package_info(package)
    precision = "fp16" if info.metadata.get(PRECISION) == "fp16" else "fp32"
    if LLMContract.read(info.metadata) is not None:
        from rlx_mil.llm.generate import Session

        prompt = [1, 2, 3, 4]
        want = Session(package, engine="milexec").generate(prompt, VERIFY_STEPS)
        got = Session(asset).generate(prompt, VERIFY_STEPS)
        same = got == want
        print(f"verify: {VERIFY_STEPS} greedy steps, the asset on Apple's Core AI runtime ({compute} compute) against"
              f" the package on the MIL executor: {'same tokens' if same else f'DIFFER ({got} vs {want})'}")
        return 0 if same else 1
    from rlx_mil import milexec

    rng = np.random.default_rng(0)
    feeds = {t.name: (rng.standard_normal(t.shape).astype(np.float32) if "float" in t.dtype or t.dtype.startswith("fp")
                      else np.zeros(t.shape, np.int32)) for t in info.inputs}
    expected = milexec.run(package, feeds)
    with AssetProgram(asset) as program:
        actual = program.run(feeds)
    worst = 0.0
    for name, value in expected.items():
        if not np.asarray(value).size:
            continue
        scale = max(float(np.max(np.abs(value))), 1e-30)
        worst = max(worst, float(np.max(np.abs(np.asarray(actual[name], np.float64) - value))) / scale)
    limit = RELATIVE_TOLERANCE[precision]
    ok = worst <= limit
    print(f"verify: the asset on Apple's Core AI runtime ({compute} compute) against the package on the MIL executor:"
          f" max deviation {worst:.2g} of the output's scale (limit {limit:g}, {precision} package;"
          f" {'ok' if ok else 'FAILED'})")
    return 0 if ok else 1
