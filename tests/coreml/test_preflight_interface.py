"""`preflight`'s dimension rules apply to the tensors compute ops read or write: a model input
only cut by data-movement ops into pieces within the limit, or a model output only joined from
such pieces, is the `interface-copy` note; a compute op touching an over-wide tensor, or an
over-wide tensor in the middle of a program, still fails."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

import rlx_mil
from rlx_mil.coreml.preflight import Finding, is_finding
from rlx_mil.ir.graph import Graph

WIDE = 20_000  # over the Neural Engine's 16,384, under 65,536


def _preflight(build: Callable[[Graph], list[int]], params: dict[str, np.ndarray] | None = None,
               device: str = "ane", fp16_io: bool = False) -> list[Finding]:
    g = Graph("interface")
    g.set_outputs(build(g))
    return rlx_mil.preflight(rlx_mil.convert(g, params or {}, fp16_io=fp16_io), device=device)


def _found(findings: list[Finding]) -> list[tuple[str, str]]:
    return sorted((f.rule, f.var) for f in findings if is_finding(f))


def _rows(g: Graph, fp16: bool = False) -> list[int]:
    """input [20000] -> reshape [2, 10000] -> mul (the framing of the Whisper mel front end);
    `fp16`: an F16 input (with `fp16_io`, WhisperKit's interface)."""
    audio = g.cast(g.input("audio", [WIDE], "f16"), "f32") if fp16 else g.input("audio", [WIDE])
    rows = g.reshape(audio, [2, WIDE // 2], name="rows")
    return [g.mul(rows, g.constant(np.array([2.0], np.float32)), name="y")]


def _scaled_then_cut(g: Graph) -> list[int]:
    """input [20000] -> mul -> reshape: a compute op reads the wide input."""
    scaled = g.mul(g.input("audio", [WIDE]), g.constant(np.array([2.0], np.float32)), name="scaled")
    return [g.reshape(scaled, [2, WIDE // 2], name="y")]


def _pieces_joined(g: Graph) -> list[int]:
    """two matmuls [1, 10000] joined by concat into the output [1, 20000] (a tied head's pieces)."""
    x = g.input("x", [1, 8])
    pieces = [g.matmul(x, g.param(f"w{j}", [8, WIDE // 2]), name=f"piece{j}") for j in range(2)]
    return [g.concat(pieces, 1, name="logits")]


def _pieces_joined_then_scaled(g: Graph) -> list[int]:
    """the joined pieces scaled before the output: the mul writes 20,000 wide."""
    return [g.mul(_pieces_joined(g)[0], g.constant(np.array([0.5], np.float32)), name="scaled_logits")]


def _one_head(g: Graph) -> list[int]:
    """one matmul writing [1, 20000] (WhisperKit's own head)."""
    return [g.matmul(g.input("x", [1, 8]), g.param("w", [8, WIDE]), name="logits")]


def _wide_in_the_middle(g: Graph) -> list[int]:
    """[2, 10000] flattened to [20000] and sliced, no model input or output wide: only moved, but
    it would split the Neural Engine's part of the program."""
    x = g.input("x", [2, WIDE // 2])
    flat = g.reshape(g.relu(x, name="act"), [WIDE], name="flat")
    return [g.relu(g.narrow(flat, 0, 5000, WIDE // 2), name="y")]


def _cut_but_still_wide(g: Graph) -> list[int]:
    """input [20000] reshaped to [1, 20000]: only moved, but the piece is as wide, and a mul reads it."""
    row = g.reshape(g.input("audio", [WIDE]), [1, WIDE], name="row")
    return [g.mul(row, g.constant(np.array([2.0], np.float32)), name="y")]


PIECES = {f"w{j}": np.ones((8, WIDE // 2), np.float32) for j in range(2)}
HEAD = {"w": np.ones((8, WIDE), np.float32)}


def test_an_input_only_cut_into_rows_is_a_note_with_the_copy_it_costs() -> None:
    findings = _preflight(_rows)
    assert _found(findings) == []
    [note] = findings
    assert (note.rule, note.severity, note.var) == ("interface-copy", "note", "audio")
    assert note.why == ("model input fp32[20000] only moved (cast, reshape): cut into pieces within 16,384;"
                        " a copy of 80,000 bytes per prediction, no compute op reads or writes it")
    # with an fp16 interface there is no cast at the boundary, and half the bytes
    [note] = _preflight(lambda g: _rows(g, fp16=True), fp16_io=True)
    assert note.why.startswith("model input fp16[20000] only moved (reshape): ") and "40,000 bytes" in note.why


def test_an_output_only_joined_from_pieces_is_a_note() -> None:
    findings = _preflight(_pieces_joined, PIECES)
    assert _found(findings) == []
    assert [(f.rule, f.var) for f in findings] == [("interface-copy", "logits")]
    assert "joined from pieces within 16,384" in findings[0].why and "concat" in findings[0].why


@pytest.mark.parametrize(("build", "params", "flagged"), [
    (_scaled_then_cut, {}, {"audio", "scaled"}),
    (_pieces_joined_then_scaled, PIECES, {"scaled_logits"}),
    (_one_head, HEAD, {"logits"}),
    (_wide_in_the_middle, {}, {"flat"}),
    (_cut_but_still_wide, {}, {"audio", "row", "y"}),
])
def test_a_compute_op_on_a_wide_tensor_still_fails(build: Callable[[Graph], list[int]], params: dict[str, np.ndarray],
                                                   flagged: set[str]) -> None:
    findings = _preflight(build, params)
    found = _found(findings)
    assert found and {rule for rule, _ in found} == {"dim-over-16384"}, found
    assert {var.split("_")[0] for _, var in found} >= {v.split("_")[0] for v in flagged}, found
    assert "interface-copy" not in {f.rule for f in findings}


def test_the_gpu_reads_the_same_groups_at_its_own_limit() -> None:
    assert _preflight(_one_head, HEAD, device="gpu") == []  # 20,000 is within the GPU's 65,536

    def audio(g: Graph) -> list[int]:
        rows = g.reshape(g.input("audio", [480_000]), [3000, 160], name="rows")
        return [g.mul(rows, g.constant(np.array([2.0], np.float32)), name="y")]

    def scaled(g: Graph) -> list[int]:
        return [g.reshape(g.mul(g.input("audio", [480_000]), g.constant(np.array([2.0], np.float32))), [3000, 160])]

    for device, limit in (("gpu", "65,536"), ("ane", "16,384")):
        [note] = _preflight(audio, device=device)
        assert note.rule == "interface-copy" and f"within {limit}" in note.why
        assert {f.rule for f in _preflight(scaled, device=device) if is_finding(f)} == {"dim-over-65536"}
