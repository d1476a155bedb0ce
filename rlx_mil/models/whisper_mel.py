"""Whisper's log-mel front end as an RLX graph (WhisperKit's `MelSpectrogram`).

openai/whisper's `log_mel_spectrogram`: a 400-point STFT (periodic Hann window, hop 160,
`center=True` with reflect padding of 200 samples each side), the power of the 201 one-sided
bins, the last frame dropped (3000 frames from 480000 samples), a Slaney mel filter bank
(librosa's `filters.mel(sr=16000, n_fft=400, n_mels)`, which is what Whisper's
`mel_filters.npz` holds), `log10(max(mel, 1e-10))` (computed as `max(log10(mel), -10)`), clamped at the whole spectrogram's
maximum less 8, then `(x + 4) / 4`.

The STFT is a convolution over the audio laid out as 3000 chunks of 160 samples (402 kernels:
the windowed cosines, then the windowed sines, each spread over the 4 chunks a frame touches);
the filter bank is a matmul.
"""

from __future__ import annotations

import math

import numpy as np

from rlx_mil.ir import Graph
from rlx_mil.models.whisper import N_FRAMES, N_SAMPLES, float_input, float_output

SAMPLE_RATE = 16_000
N_FFT = 400
HOP = 160
BINS = N_FFT // 2 + 1


def _hz_to_mel(f: np.ndarray) -> np.ndarray:
    """The Slaney mel scale: linear below 1 kHz (3 mels per 200 Hz), logarithmic above."""
    f = np.asarray(f, np.float64)
    linear = f / (200.0 / 3)
    log_part = 15.0 + np.log(np.maximum(f, 1e-10) / 1000.0) / (np.log(6.4) / 27.0)
    return np.where(f >= 1000.0, log_part, linear)


def _mel_to_hz(m: np.ndarray) -> np.ndarray:
    m = np.asarray(m, np.float64)
    linear = m * (200.0 / 3)
    log_part = 1000.0 * np.exp((np.log(6.4) / 27.0) * (m - 15.0))
    return np.where(m >= 15.0, log_part, linear)


def mel_filters(n_mels: int, sample_rate: int = SAMPLE_RATE, n_fft: int = N_FFT) -> np.ndarray:
    """`[n_mels, n_fft / 2 + 1]` triangular Slaney-normalised filters from 0 Hz to Nyquist."""
    fft_freqs = np.linspace(0.0, sample_rate / 2, n_fft // 2 + 1)
    mel_points = _mel_to_hz(np.linspace(_hz_to_mel(np.array(0.0)), _hz_to_mel(np.array(sample_rate / 2)), n_mels + 2))
    widths = np.diff(mel_points)
    ramps = mel_points[:, None] - fft_freqs[None, :]
    lower = -ramps[:-2] / widths[:-1, None]
    upper = ramps[2:] / widths[1:, None]
    weights = np.maximum(0.0, np.minimum(lower, upper))
    weights *= (2.0 / (mel_points[2:] - mel_points[:-2]))[:, None]
    return weights.astype(np.float32)


def stft_kernels(n_fft: int = N_FFT) -> np.ndarray:
    """`[2 * bins, 1, 1, n_fft]`: the periodic-Hann-windowed cosines then sines of each bin."""
    n = np.arange(n_fft, dtype=np.float64)
    window = 0.5 - 0.5 * np.cos(2 * math.pi * n / n_fft)
    k = np.arange(n_fft // 2 + 1, dtype=np.float64)[:, None]
    phase = 2 * math.pi * k * n[None, :] / n_fft
    kernels = np.concatenate([np.cos(phase) * window, -np.sin(phase) * window])
    return kernels.reshape(2 * (n_fft // 2 + 1), 1, 1, n_fft).astype(np.float32)


def chunk_kernels(n_fft: int = N_FFT, hop: int = HOP) -> tuple[np.ndarray, int, int]:
    """The STFT as a convolution over hop-sized chunks: `[2 * bins, hop, 1, taps]` weights
    for the audio laid out `[1, hop, 1, chunks]` (sample `hop * chunk + offset`), and how many
    chunks precede and follow a frame's own: frame t (samples `hop * t - n_fft / 2` up to
    `hop * t + n_fft / 2`) spans chunks t - before .. t + after."""
    basis = stft_kernels(n_fft).reshape(-1, n_fft)
    lead = n_fft // 2
    before = -((-lead) // hop)  # chunks reaching back n_fft / 2 samples
    shift = before * hop - lead  # where the frame starts inside its first chunk
    taps = -((-(shift + n_fft)) // hop)
    kernels = np.zeros((basis.shape[0], hop, 1, taps), np.float32)
    for j in range(taps):
        for c in range(hop):
            n = hop * j + c - shift
            if 0 <= n < n_fft:
                kernels[:, c, 0, j] = basis[:, n]
    return kernels, before, taps - before - 1


def build_log_mel(n_mels: int, name: str = "MelSpectrogram", *, fp16_io: bool = False) -> tuple[Graph, dict[str, np.ndarray]]:
    """`audio [480000]` -> `melspectrogram_features [1, n_mels, 1, 3000]`, and the graph's
    computed params (the STFT kernels and the filter bank); `fp16_io`: F16 input and output.

    No tensor but the audio itself is longer than 16,384 (the Neural Engine's limit): the audio
    is laid out as 3000 chunks of 160 samples, the STFT is a convolution over chunks, and the
    three frames that reach into Whisper's reflect padding (the first two and the last) are
    computed on their own from the few samples they need, reflected by a permutation matmul."""
    kernels, before, after = chunk_kernels()
    chunks = N_SAMPLES // HOP
    lead = N_FFT // 2
    g = Graph(name)
    audio = float_input(g, "audio", [N_SAMPLES], fp16_io)
    # interior frames: a convolution over the zero-padded chunk sequence
    rows = g.reshape(audio, [chunks, HOP], name="stft.chunks")
    layout = g.reshape(g.transpose(rows, [1, 0], name="stft.chunk_major"), [1, HOP, 1, chunks], name="stft.layout")
    padded = g.pad(layout, [(0, 0), (0, 0), (0, 0), (before, after)], 0.0, name="stft.pad")
    conv = g.conv(padded, g.param("stft.chunk_kernels", list(kernels.shape)), name="stft")  # [1, 402, 1, 3000]
    # the frames Whisper's reflect padding reaches: 0 and 1 at the start, 2999 at the end
    flip = g.param("stft.reverse", [lead, lead])
    basis = g.param("stft.basis", [N_FFT, 2 * BINS])
    head_reflect = g.matmul(g.reshape(g.narrow(audio, 0, 1, lead), [1, lead]), flip, name="stft.head_reflect")
    head = g.concat([head_reflect, g.reshape(g.narrow(audio, 0, 0, HOP + N_FFT - lead), [1, HOP + N_FFT - lead])], 1,
                    name="stft.head")  # padded samples 0 .. 559
    first = g.concat([g.narrow(head, 1, 0, N_FFT), g.narrow(head, 1, HOP, N_FFT)], 0, name="stft.first_frames")
    last_start = HOP * (N_FRAMES - 1) - lead  # 479640: the last frame's first sample
    inside = N_SAMPLES - last_start  # 360 samples, then 40 reflected
    tail_len = N_FFT - inside
    tail_flip = g.param("stft.tail_reverse", [tail_len, tail_len])
    tail_reflect = g.matmul(g.reshape(g.narrow(audio, 0, N_SAMPLES - 1 - tail_len, tail_len), [1, tail_len]), tail_flip,
                            name="stft.tail_reflect")
    last = g.concat([g.reshape(g.narrow(audio, 0, last_start, inside), [1, inside]), tail_reflect], 1,
                    name="stft.last_frame")
    edges = g.matmul(g.concat([first, last], 0, name="stft.edge_frames"), basis, name="stft.edges")  # [3, 402]
    edges = g.reshape(g.transpose(edges, [1, 0], name="stft.edges_t"), [1, 2 * BINS, 1, 3], name="stft.edges_4d")
    frames = g.concat([g.narrow(edges, 3, 0, 2), g.narrow(conv, 3, 2, N_FRAMES - 3), g.narrow(edges, 3, 2, 1)], 3,
                      name="stft.frames")
    parts = g.reshape(g.mul(frames, frames, name="stft.squared"), [2, BINS, N_FRAMES], name="stft.parts")
    power = g.sum(parts, 0, name="stft.power")  # [201, 3000]
    filters = g.param("mel.filters", [n_mels, BINS])
    mel = g.matmul(filters, power, name="mel")
    # log10(max(mel, 1e-10)) as max(log10(mel), -10): the same numbers, and an fp16 program (where
    # 1e-10 is 0) turns silence into -10 rather than log(0) = -inf
    raw = g.mul(g.log(mel, name="mel.ln"), g.constant(np.array([1 / math.log(10)], np.float32)), name="mel.log10_raw")
    log10 = g.maximum(raw, g.constant(np.array([-10.0], np.float32), name="mel.floor_value"), name="mel.log10")
    peak = g.max(log10, [0, 1], keep_dim=True, name="mel.peak")
    low = g.sub(peak, g.constant(np.array([8.0], np.float32)), name="mel.peak_less_8")
    clamped = g.maximum(log10, low, name="mel.clamped")
    scaled = g.mul(g.add(clamped, g.constant(np.array([4.0], np.float32)), name="mel.plus_4"),
                   g.constant(np.array([0.25], np.float32)), name="mel.scaled")
    out = g.reshape(scaled, [1, n_mels, 1, N_FRAMES], name="mel.features")
    g.set_outputs([float_output(g, out, "melspectrogram_features", fp16_io)])
    params = {"stft.chunk_kernels": kernels, "stft.reverse": np.eye(lead, dtype=np.float32)[::-1].copy(),
              "stft.tail_reverse": np.eye(tail_len, dtype=np.float32)[::-1].copy(),
              "stft.basis": np.ascontiguousarray(stft_kernels().reshape(2 * BINS, N_FFT).T),
              "mel.filters": mel_filters(n_mels)}
    return g, params
