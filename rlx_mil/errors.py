"""Typed errors raised by rlx_mil.

Every error that stems from user input is an :class:`RlxMilError`, so callers can catch one
base class. Subclasses say *what* went wrong; messages name the node, op, input or parameter
at fault.
"""

from __future__ import annotations


class RlxMilError(Exception):
    """Base class of every error rlx_mil raises on purpose."""


class GraphError(RlxMilError):
    """A graph violates an IR rule (shape, dtype, arity, axis, unknown node id...)."""

    def __init__(
        self,
        message: str,
        *,
        node: int | None = None,
        op: str | None = None,
        name: str | None = None,
        operand: str | None = None,
    ) -> None:
        self.node = node
        self.op = op
        self.name = name
        self.operand = operand
        where = []
        if node is not None:
            where.append(f"node %{node}")
        if name:
            where.append(f"'{name}'")
        if op is not None:
            where.append(f"({op})")
        if operand is not None:
            where.append(f"operand {operand}")
        prefix = " ".join(where)
        super().__init__(f"{prefix}: {message}" if prefix else message)
        self.detail = message


class ShapeError(GraphError):
    """Rank, shape or broadcast mismatch."""


class DTypeError(GraphError):
    """An operand has a dtype the op does not accept."""


class AttributeValueError(GraphError, ValueError):
    """An op attribute is out of range, mistyped or inconsistent (bad axis, heads not dividing...).

    Also a ValueError: op constructors (`MaskKind`, `QuantScheme`, float attributes) raise it,
    and code around them may catch ValueError."""


class ArityError(GraphError):
    """An op received the wrong number of inputs."""


class UnknownNodeError(GraphError):
    """A node id does not refer to an existing node."""


class GraphFormatError(RlxMilError):
    """Serialized graph text (JSON) is malformed, hostile or inconsistent."""


class JsonVersionError(GraphFormatError):
    """A graph holds something the requested JSON version (e.g. upstream 0.2.2) cannot express."""


class EvaluationError(RlxMilError):
    """Inputs or params handed to an evaluator are missing, extra or mis-shaped."""

    def __init__(self, message: str, problems: list[str] | None = None) -> None:
        self.problems = list(problems or [])
        if self.problems:
            message = message + ":\n  - " + "\n  - ".join(self.problems)
        super().__init__(message)


class ParamError(EvaluationError):
    """Params handed to convert/lower are missing, extra, mis-shaped or mistyped."""


class UnsupportedOpError(RlxMilError):
    """No lowering (or no executor kernel) exists for an op, or the target cannot express it."""


class UnsupportedOpFormatError(GraphFormatError, UnsupportedOpError):
    """Serialized graph text holds an upstream op kind rlx_mil knows of but does not support."""


class ConversionError(RlxMilError):
    """Conversion failed for a reason that is not a graph or param defect."""


class CompressionError(RlxMilError):
    """A weight cannot be compressed as asked: non-finite values, or a scheme (bit width,
    granularity, block size) the deployment target or the weight's shape cannot express. The
    message names the weight and the target."""


class CompressionWarning(UserWarning):
    """A compressed model's measured output error exceeds the documented threshold, or a
    compression choice was made for the user (e.g. a grouped palette held per tensor)."""


class MilExecError(RlxMilError):
    """The NumPy MIL executor cannot run a program (missing kernel, bad feed...)."""


class AmbiguousLayoutWarning(UserWarning):
    """An attention operand's layout is read by the upstream rule but could mean another."""


class InvalidOptionError(RlxMilError, ValueError):
    """A conversion option (target, precision, compute units, attention mode, path) is invalid."""


class PrecisionWarning(UserWarning):
    """Values will not survive the requested compute precision (e.g. beyond fp16's range)."""


class Fp16OverflowWarning(PrecisionWarning):
    """A package checked on generated inputs (`--verify`) computes inf or NaN where its
    graph's reference is finite: an fp16 value passed 65,504. The message names the output and
    the op where the non-finite values start (`op`); converting with precision='fp32' avoids it."""

    def __init__(self, message: str, *, op: str | None = None) -> None:
        self.op = op
        super().__init__(message)


class UnsupportedConfigError(RlxMilError):
    """A model configuration (Hugging Face `config.json`) asks for an architecture, or a field
    value, that rlx_mil does not implement; the message names the file, field and value."""

    def __init__(self, message: str, *, field: str | None = None, value: object = None) -> None:
        self.field = field
        self.value = value
        super().__init__(message)


class IgnoredConfigKeyWarning(UserWarning):
    """A config key that transformers reads past without using (e.g. `factor` under RoPE type
    `default`) is left unused as transformers leaves it; the message names the file and key."""


class CheckpointError(RlxMilError):
    """A checkpoint folder is unreadable or its tensors do not match the architecture its
    config describes; every missing, unexpected and mis-shaped tensor is listed at once."""

    def __init__(self, message: str, problems: list[str] | None = None) -> None:
        self.problems = list(problems or [])
        if self.problems:
            message = message + ":\n  - " + "\n  - ".join(self.problems)
        super().__init__(message)


class WeightsFormatError(RlxMilError):
    """A weights (or array container) file is unreadable, truncated, hostile or inconsistent."""


class GGUFFormatError(WeightsFormatError):
    """A GGUF file is truncated, hostile or inconsistent (tensor data past the end, a shape that
    does not fit its type, an unknown type, counts the file cannot hold); `tensor` names the
    tensor at fault when there is one."""

    def __init__(self, message: str, *, tensor: str | None = None) -> None:
        self.tensor = tensor
        super().__init__(message)


class AudioFormatError(RlxMilError, ValueError):
    """An audio file (or array) cannot be transcribed: not a WAV, a header that does not parse,
    data cut short, no samples, NaN or infinite samples, a sample rate or channel count out of
    range. The message names the file."""


class UnknownTensorError(RlxMilError, KeyError):
    """A tensor name that a weights file does not hold (also a KeyError, as Mappings raise)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class FileAccessError(RlxMilError, OSError):
    """A path cannot be read or written as asked: missing, not a regular file (a device, FIFO,
    directory), no permission, already there, disk full. Subclasses also derive from the
    matching builtin OSError, so `except FileExistsError` keeps working."""


class MissingFileError(FileAccessError, FileNotFoundError):
    """A file or folder that should exist does not."""


class ExistingFileError(FileAccessError, FileExistsError):
    """The destination exists and replacing it was not asked for."""


class NotADirectoryPathError(FileAccessError, NotADirectoryError):
    """A path component that must be a folder is a file."""


class IsADirectoryPathError(FileAccessError, IsADirectoryError):
    """A path that must be a file is a folder."""


class FileAccessPermissionError(FileAccessError, PermissionError):
    """The operating system refused access to a path."""


class SpecialFileError(FileAccessError):
    """A path names a device, FIFO or socket where a regular file is needed."""


_FILE_ERROR_CLASSES: tuple[tuple[type[OSError], type[FileAccessError]], ...] = (
    (FileNotFoundError, MissingFileError),
    (FileExistsError, ExistingFileError),
    (NotADirectoryError, NotADirectoryPathError),
    (IsADirectoryError, IsADirectoryPathError),
    (PermissionError, FileAccessPermissionError),
)


def file_access_error(err: OSError, message: str) -> FileAccessError:
    """The FileAccessError subclass matching builtin `err`, carrying its errno."""
    cls = next((ours for builtin, ours in _FILE_ERROR_CLASSES if isinstance(err, builtin)), FileAccessError)
    typed = cls(message)
    typed.errno = err.errno
    return typed


class CoreAIUnavailableError(RlxMilError, ImportError):
    """A Core AI feature was asked for, but Apple's `coreai-core` is not installed (it is an
    optional extra for Python >= 3.11)."""


class CoreAITranslationError(RlxMilError):
    """A MIL program holds something the Core AI translator cannot express (the op, input or
    form is named)."""


class HubError(RlxMilError):
    """A Hugging Face Hub id that cannot be had: no such repository or file, no network and no
    cached copy, or offline mode (`HF_HUB_OFFLINE`) without one."""
