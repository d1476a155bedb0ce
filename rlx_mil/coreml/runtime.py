"""Whether this machine can run Core ML packages itself (`MLModel.predict`)."""

from __future__ import annotations

import sys


def coreml_available() -> bool:
    """True where `MLModel.predict` works (macOS with the Core ML runtime)."""
    if sys.platform != "darwin":
        return False
    try:
        from coremltools.libcoremlpython import _MLModelProxy  # noqa: F401
    except ImportError:
        return False
    return True
