"""Mac-side smoke test of rlx_mil's Core AI assets: load each `.aimodel` given and run one step
of each entry point (zeros for float inputs, small ids for integer ones; states from zeros).

On macOS 27 with `coreai-core` installed from its wheel, `coreai.runtime` runs the assets
through the OS's Core AI framework (its CPU/GPU/Neural Engine compilation), which this Linux
machine cannot show; elsewhere it runs Apple's bundled CPU runtime.

    python benchmarks/coreai_mac_smoke.py chat.aimodel int4.aimodel ...
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def smoke(path: Path) -> bool:
    from rlx_mil.coreai.asset import AssetProgram

    ok = True
    start = time.perf_counter()
    with AssetProgram(path) as asset:
        loaded = time.perf_counter() - start
        print(f"{path}: loaded in {loaded:.2f} s; entry points {sorted(asset.entries)}")
        for name, entry in asset.entries.items():
            feeds = {}
            for input_name, (shape, dtype) in entry.inputs.items():
                concrete = tuple(d if d > 0 else 1 for d in shape)
                feeds[input_name] = (np.zeros(concrete, dtype) if dtype.kind == "f"
                                     else np.ones(concrete, dtype) if dtype.kind in "iu" else np.zeros(concrete, bool))
            begun = time.perf_counter()
            try:
                outputs = asset.run(feeds, function_name=name)
            except Exception as err:  # report every entry point, then fail
                print(f"  {name}: FAILED {type(err).__name__}: {err}")
                ok = False
                continue
            finite = all(np.all(np.isfinite(v)) for v in outputs.values() if np.asarray(v).dtype.kind == "f")
            shapes = {k: list(np.asarray(v).shape) for k, v in outputs.items()}
            print(f"  {name}: one step in {time.perf_counter() - begun:.3f} s, outputs {shapes}, finite {finite}")
            ok = ok and finite
    return ok


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("assets", nargs="+", type=Path)
    args = parser.parse_args()
    import coreai.runtime as runtime

    print(f"{platform.system()} {platform.mac_ver()[0] or platform.release()}; OS Core AI framework: "
          f"{getattr(runtime, '_use_os_coreai', False)}")
    results = [smoke(path) for path in args.assets]
    return 0 if all(results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
