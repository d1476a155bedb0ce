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
            if getattr(args, "verify", False):
                return verify_asset(args.output, asset)
            return 0
        finally:
            args.output = asset
            shutil.rmtree(staging, ignore_errors=True)

    return run


#: Greedy steps `--verify` compares between the asset (Apple's runtime) and the package.
VERIFY_STEPS = 8


def verify_asset(package: Path, asset: Path) -> int:
    """`--verify` of an asset: the package was checked against the reference (milexec); the
    asset, run by Apple's Core AI runtime, must then give the package's greedy tokens (an LLM)
    or its outputs on example inputs (within 1e-4 relative)."""
    import numpy as np

    from rlx_mil.coreai.asset import AssetProgram
    from rlx_mil.coreml.metadata import LLMContract
    from rlx_mil.coreml.package_info import package_info

    info = package_info(package)
    if LLMContract.read(info.metadata) is not None:
        from rlx_mil.llm.generate import Session

        prompt = [1, 2, 3, 4]
        want = Session(package, engine="milexec").generate(prompt, VERIFY_STEPS)
        got = Session(asset).generate(prompt, VERIFY_STEPS)
        same = got == want
        print(f"verify: {VERIFY_STEPS} greedy steps on Apple's Core AI runtime against the package on milexec:"
              f" {'same tokens' if same else f'DIFFER ({got} vs {want})'}")
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
    ok = worst <= 1e-4
    print(f"verify: the asset on Apple's Core AI runtime against the package on milexec: max deviation"
          f" {worst:.2g} of the output's scale ({'ok' if ok else 'FAILED'})")
    return 0 if ok else 1
