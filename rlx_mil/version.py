"""The version of rlx_mil (written into every package's metadata)."""

__version__ = "0.1.0"
