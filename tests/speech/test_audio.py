"""Reading audio: WAV sample formats, channel mixing, resampling, windows, and hostile files
(each ends in one typed AudioFormatError naming the file)."""

from __future__ import annotations

import io
import struct
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlx_mil.errors import AudioFormatError, FileAccessError, RlxMilError
from rlx_mil.speech.audio import (
    MAX_SECONDS,
    as_audio,
    content_frames,
    read_audio,
    window,
    window_frames,
)
from rlx_mil.speech.model import N_FRAMES, N_SAMPLES


def tone(freq: float, rate: int, seconds: float, amplitude: float = 0.5) -> np.ndarray:
    t = np.arange(round(rate * seconds)) / rate
    return (amplitude * np.sin(2 * np.pi * freq * t)).astype(np.float32)


def wav_bytes(rate: int, channels: int, bits: int, data: bytes, *, fmt: int = 1, data_size: int | None = None,
              extra_chunk: bytes = b"") -> bytes:
    """A RIFF WAV with a PCM (fmt 1) or float (fmt 3) header; `data_size` may lie."""
    block = channels * bits // 8
    fmt_chunk = struct.pack("<4sIHHIIHH", b"fmt ", 16, fmt, channels, rate, rate * block, block, bits)
    size = len(data) if data_size is None else data_size
    body = b"WAVE" + fmt_chunk + extra_chunk + struct.pack("<4sI", b"data", size) + data
    return struct.pack("<4sI", b"RIFF", len(body)) + body


def write(tmp_path: Path, name: str, data: bytes) -> Path:
    path = tmp_path / name
    path.write_bytes(data)
    return path


@pytest.mark.parametrize(("subtype", "tolerance"), [("PCM_16", 1 / 32768), ("PCM_24", 1 / 2**23), ("PCM_32", 1 / 2**31),
                                                    ("FLOAT", 0.0), ("DOUBLE", 1e-7), ("PCM_U8", 1 / 128)])
def test_every_wav_sample_format_reads_as_float32(tmp_path: Path, subtype: str, tolerance: float) -> None:
    samples = tone(440, 16000, 0.5)
    path = tmp_path / f"{subtype}.wav"
    sf.write(path, samples, 16000, subtype=subtype)
    audio = read_audio(path)
    assert audio.samples.dtype == np.float32 and audio.source_rate == 16000 and audio.name == str(path)
    np.testing.assert_allclose(audio.samples, samples, atol=tolerance + 1e-7)


def test_stereo_is_mixed_to_mono(tmp_path: Path) -> None:
    left, right = tone(300, 16000, 0.25), tone(700, 16000, 0.25, 0.25)
    sf.write(tmp_path / "s.wav", np.stack([left, right], axis=1), 16000, subtype="FLOAT")
    audio = read_audio(tmp_path / "s.wav")
    assert audio.source_channels == 2
    np.testing.assert_allclose(audio.samples, (left + right) / 2, atol=1e-7)


def test_more_than_two_channels_are_refused(tmp_path: Path) -> None:
    sf.write(tmp_path / "surround.wav", np.zeros((1600, 8), np.float32), 16000)
    with pytest.raises(AudioFormatError, match=r"surround\.wav: 8 channels.*mix it down"):
        read_audio(tmp_path / "surround.wav")


@pytest.mark.parametrize("rate", [8000, 22050, 44100, 48000, 96000])
def test_resampling_keeps_a_tones_frequency_and_level(tmp_path: Path, rate: int) -> None:
    sf.write(tmp_path / "t.wav", tone(1000, rate, 1.0), rate, subtype="FLOAT")
    audio = read_audio(tmp_path / "t.wav")
    assert abs(len(audio.samples) - 16000) <= 1 and audio.source_rate == rate
    spectrum = np.abs(np.fft.rfft(audio.samples[2000:14000] * np.hanning(12000)))
    peak = np.argmax(spectrum) * 16000 / 12000
    assert abs(peak - 1000) < 2
    assert np.sqrt(np.mean(audio.samples[2000:14000] ** 2)) == pytest.approx(0.5 / np.sqrt(2), rel=0.01)


def test_resampling_filters_what_16_khz_cannot_hold(tmp_path: Path) -> None:
    # 11 kHz is above 16 kHz's Nyquist limit: a proper filter removes it instead of folding it to 5 kHz
    sf.write(tmp_path / "high.wav", tone(11000, 44100, 1.0), 44100, subtype="FLOAT")
    audio = read_audio(tmp_path / "high.wav")
    assert np.sqrt(np.mean(audio.samples[2000:14000] ** 2)) < 0.005


def test_long_audio_resamples_in_blocks_like_at_once(tmp_path: Path) -> None:
    import soxr

    samples = np.random.default_rng(0).standard_normal(200_000).astype(np.float32) * 0.1
    sf.write(tmp_path / "n.wav", samples, 22050, subtype="FLOAT")
    audio = read_audio(tmp_path / "n.wav")
    whole = soxr.resample(samples, 22050, 16000, quality="HQ")
    assert len(audio.samples) == len(whole)
    np.testing.assert_allclose(audio.samples, whole, atol=1e-5)


def test_flac_reads(tmp_path: Path) -> None:
    sf.write(tmp_path / "t.flac", tone(440, 16000, 0.2), 16000, subtype="PCM_16")
    assert len(read_audio(tmp_path / "t.flac").samples) == 3200


@pytest.mark.parametrize(
    ("name", "data", "message"),
    [
        ("text.wav", b"this is not audio at all, just text\n" * 4, "not a readable WAV file"),
        ("empty.wav", b"", "not a readable WAV file"),
        ("zero.wav", wav_bytes(16000, 1, 16, b""), "holds no audio samples"),
        ("cut.wav", wav_bytes(16000, 1, 16, b"\x01\x00" * 100, data_size=400), "truncated"),
        ("huge.wav", wav_bytes(16000, 1, 16, b"\x01\x00" * 100, data_size=0xFFFFFFF0), "truncated"),
        ("chunk.wav", wav_bytes(16000, 1, 16, b"\x01\x00" * 100, extra_chunk=b"LIST\xf0\xff\xff\x7f"), "truncated"),
        ("slow.wav", wav_bytes(1, 1, 16, b"\x01\x00" * 100), "sample rate 1 Hz"),
        ("fast.wav", wav_bytes(4_000_000, 1, 16, b"\x01\x00" * 100), "sample rate 4000000 Hz"),
        ("nan.wav", wav_bytes(16000, 1, 32, np.array([0.1, np.nan, 0.2], "<f4").tobytes(), fmt=3), "sample 1 .* NaN"),
        ("inf.wav", wav_bytes(16000, 1, 64, np.array([0.1, 0.2, np.inf], "<f8").tobytes(), fmt=3), "sample 2 .* NaN or inf"),
        ("many.wav", wav_bytes(16000, 8, 16, b"\x00" * 160), "8 channels"),
    ],
)
def test_malformed_audio_is_one_typed_error_naming_the_file(tmp_path: Path, name: str, data: bytes, message: str) -> None:
    path = write(tmp_path, name, data)
    with pytest.raises(AudioFormatError, match=message) as caught:
        read_audio(path)
    text = str(caught.value)
    assert text.startswith(f"{path}: ") and "\n" not in text


def test_other_formats_are_refused(tmp_path: Path) -> None:
    sf.write(tmp_path / "t.aiff", tone(440, 16000, 0.1), 16000)
    with pytest.raises(AudioFormatError, match="AIFF file, not WAV"):
        read_audio(tmp_path / "t.aiff")


def test_audio_longer_than_the_limit_is_refused_before_reading(tmp_path: Path) -> None:
    # the header says 5 hours at 8 kHz; the file holds only what the header can describe
    frames = 5 * 3600 * 8000
    path = write(tmp_path, "long.wav", wav_bytes(8000, 1, 16, b"\x00\x00" * 100, data_size=2 * frames))
    with pytest.raises(AudioFormatError, match="truncated"):
        read_audio(path)
    sf.write(tmp_path / "ok.wav", np.zeros(16000, np.float32), 16000)
    with pytest.raises(AudioFormatError, match="more than the limit of 0 s"):
        read_audio(tmp_path / "ok.wav", max_seconds=0.5)
    assert MAX_SECONDS == 3 * 3600


def test_paths_that_are_not_files_are_typed_errors(tmp_path: Path) -> None:
    with pytest.raises(FileAccessError, match="no such audio file"):
        read_audio(tmp_path / "missing.wav")
    with pytest.raises(FileAccessError, match="a directory"):
        read_audio(tmp_path)


def test_arrays_are_taken_as_16_khz_mono() -> None:
    audio = as_audio(np.zeros(100, np.float64))
    assert audio.samples.dtype == np.float32 and audio.source_rate == 16000
    for bad in (np.zeros((2, 100), np.float32), np.zeros(0, np.float32), np.zeros(10, np.int16),
                np.array([0.0, np.nan], np.float32)):
        with pytest.raises(AudioFormatError):
            as_audio(bad)


def test_windows_are_30_s_zero_padded_from_the_seek_frame() -> None:
    audio = as_audio(np.arange(70 * 16000, dtype=np.float32))
    assert content_frames(audio) == 7000
    first = window(audio, 0)
    assert first.shape == (N_SAMPLES,) and first[-1] == N_SAMPLES - 1
    last = window(audio, 6000)
    assert last[0] == 6000 * 160 and last[10 * 16000 - 1] == 70 * 16000 - 1 and not last[10 * 16000:].any()
    assert [window_frames(audio, s) for s in (0, 3000, 6000, 6999, 7000)] == [N_FRAMES, N_FRAMES, 1000, 1, 0]


_VALID = wav_bytes(16000, 1, 16, (np.arange(400, dtype="<i2") * 50).tobytes())


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(edits=st.lists(st.tuples(st.integers(0, 59), st.integers(0, 255)), min_size=1, max_size=6),
       cut=st.integers(0, len(_VALID)))
def test_hostile_headers_read_or_fail_typed(tmp_path: Path, edits: list[tuple[int, int]], cut: int) -> None:
    data = bytearray(_VALID)
    for offset, value in edits:
        data[offset] = value
    path = write(tmp_path, "fuzz.wav", bytes(data[:cut] if cut > 8 else data))
    try:
        audio = read_audio(path)
    except RlxMilError as err:
        assert str(err).startswith(str(path)) and "\n" not in str(err)
        return
    assert audio.samples.dtype == np.float32 and audio.samples.ndim == 1 and np.isfinite(audio.samples).all()
    assert 0 < len(audio.samples) <= 16000 * 8 * len(data)  # no more audio than the bytes can hold


def test_in_memory_wav_helper_matches_soundfile() -> None:
    samples, rate = sf.read(io.BytesIO(_VALID), dtype="int16")
    assert rate == 16000 and list(samples[:3]) == [0, 50, 100]
