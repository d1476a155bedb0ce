"""`--format aimodel` (or an `-o NAME.aimodel`) on `convert`, `convert-hf` and `convert-gguf`:
the command converts as usual into a temporary `.mlpackage` beside the output (verified as
usual with `--verify`), which is then written as Apple's Core AI asset (`rlx_mil.coreai`) and
removed."""

from __future__ import annotations

import argparse
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

FORMATS = ("mlpackage", "aimodel")


def add_format_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument("--format", choices=FORMATS, default=None,
                   help="mlpackage (Core ML) or aimodel (Apple's Core AI asset; the coreai extra); default: the"
                        " output's suffix")


def wants_aimodel(args: argparse.Namespace) -> bool:
    output = getattr(args, "output", None)
    return getattr(args, "format", None) == "aimodel" or (output is not None and Path(output).suffix == ".aimodel")


def wrap(handler: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """`handler` writing a Core AI asset when the arguments ask for one."""

    def run(args: argparse.Namespace) -> int:
        if not wants_aimodel(args):
            return handler(args)
        from rlx_mil.coreai import require
        from rlx_mil.coreai.asset import save_aimodel
        from rlx_mil.errors import ExistingFileError, InvalidOptionError

        require()  # before any conversion work
        asset = Path(args.output)
        if asset.suffix != ".aimodel":
            asset = asset.with_suffix(".aimodel") if asset.suffix == ".mlpackage" else asset.with_name(asset.name + ".aimodel")
        if getattr(args, "chunk_bytes", None):
            raise InvalidOptionError("--format aimodel writes one asset; drop --chunk-bytes")
        if asset.exists() and not getattr(args, "overwrite", False):
            raise ExistingFileError(f"{asset} exists; pass --overwrite to replace it")
        asset.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=".rlx_mil_convert_", dir=asset.parent))
        try:
            args.output = staging / (asset.stem + ".mlpackage")
            code = handler(args)
            if code != 0:
                return code
            save_aimodel(args.output, asset, overwrite=True)
            size = sum(f.stat().st_size for f in asset.rglob("*") if f.is_file())
            print(f"wrote {asset} (Core AI asset, {size} bytes; fp32 compute)")
            return 0
        finally:
            args.output = asset
            shutil.rmtree(staging, ignore_errors=True)

    return run
