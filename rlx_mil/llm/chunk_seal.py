"""What ties a chunked set's manifest to its chunk packages, checked when the set is opened.

Each chunk entry records its package's fingerprint: the SHA-256 of the package's files' paths
and sizes, the whole of each small file (the program's spec, the tokenizer files) and 16
evenly spaced 4 KiB samples of each large one (the weights: reading a few dozen KiB of a
gigabyte file costs milliseconds, and another model's weights differ in them). The manifest
records its own digest. A chunk missing, swapped with another, taken from another model or
edited, and a manifest edited by hand, are told apart when the set is opened, naming the chunk.
`Manifest.json` is left out: coremltools rewrites it when it opens a package.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

SMALL_FILE = 1 << 20
SAMPLES = 16
SAMPLE_BYTES = 4096


def package_fingerprint(package: Path) -> str:
    """The fingerprint of the package folder `package` (see the module docstring)."""
    digest = hashlib.sha256()
    files = sorted(p for p in package.rglob("*") if p.is_file() and p.name != "Manifest.json")
    for path in files:
        size = path.stat().st_size
        digest.update(f"{path.relative_to(package).as_posix()}\0{size}\0".encode())
        with open(path, "rb") as stream:
            if size <= SMALL_FILE:
                digest.update(stream.read())
                continue
            for k in range(SAMPLES):
                stream.seek((size - SAMPLE_BYTES) * k // (SAMPLES - 1))
                digest.update(stream.read(SAMPLE_BYTES))
    return digest.hexdigest()


def manifest_digest(manifest: Mapping[str, Any]) -> str:
    """The digest of a manifest's content, its own `digest` field left out."""
    body = {k: v for k, v in manifest.items() if k != "digest"}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def sealed(manifest: dict[str, Any]) -> dict[str, Any]:
    return {**manifest, "digest": manifest_digest(manifest)}
