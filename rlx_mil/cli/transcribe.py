"""`rlx-mil transcribe FOLDER AUDIO... [--language xx] [--task transcribe|translate]
[--timestamps] [--json]`: speech to text with a Whisper package folder (docs/speech.md)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

EXIT_OK = 0


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("folder", type=Path, help="the Whisper package folder convert-hf writes (openai_whisper-*)")
    p.add_argument("audio", type=Path, nargs="+", help="WAV files (PCM 8-32 bit or float, any rate, mono or stereo)")
    p.add_argument("--language", metavar="CODE", help="the spoken language (en, de, ...); detected when not given")
    p.add_argument("--task", default="transcribe", choices=["transcribe", "translate"],
                   help="transcribe (default) or translate into English")
    p.add_argument("--timestamps", action="store_true",
                   help="decode timed segments (Whisper's timestamp tokens); text lines get [start --> end]")
    p.add_argument("--json", action="store_true",
                   help="one JSON object per audio file: language, text and segments (start, end, text, tokens)")
    p.add_argument("--stateful", action="store_true",
                   help="run the folder's stateful text decoder (KV cache as Core ML state) instead of WhisperKit's")
    p.add_argument("--engine", default="auto", choices=["auto", "coreml", "milexec"],
                   help="what runs the packages: Core ML (macOS), the NumPy MIL executor, or auto (Core ML where it runs)")
    p.add_argument("-q", "--quiet", action="store_true", help="no engine or speed lines on stderr")


def run(args: argparse.Namespace) -> int:
    from rlx_mil.speech.audio import probe_audio
    from rlx_mil.speech.decoding import DecodingOptions
    from rlx_mil.speech.transcription import Transcriber, check_speech_folder

    check_speech_folder(args.folder)
    for path in args.audio:  # every file's header, before the packages load
        probe_audio(path)
    start, cpu = time.perf_counter(), time.process_time()
    transcriber = Transcriber(args.folder, stateful=args.stateful, engine=args.engine)
    DecodingOptions(language=args.language, task=args.task, timestamps=args.timestamps).check(transcriber.tokens)
    if not args.quiet:
        print(f"{args.folder}: opened in {time.perf_counter() - start:.2f} s (CPU {time.process_time() - cpu:.2f} s);"
              f" engine {getattr(transcriber.model, 'engine', 'custom')}",
              file=sys.stderr, flush=True)
    for path in args.audio:
        _transcribe_one(transcriber, path, args)
    return EXIT_OK


def _transcribe_one(transcriber: Any, path: Path, args: argparse.Namespace) -> None:
    from rlx_mil.speech.audio import read_audio

    audio = read_audio(path)
    prefix = f"{path}: " if len(args.audio) > 1 and not args.json else ""
    started = [False]

    def show(piece: str) -> None:
        if not started[0]:
            piece = prefix + piece.lstrip()
            started[0] = bool(piece)
        sys.stdout.write(piece)
        sys.stdout.flush()

    def show_segment(segment: Any) -> None:
        sys.stdout.write(f"{prefix}[{_clock(segment.start)} --> {_clock(segment.end)}] {segment.text.strip()}\n")
        sys.stdout.flush()

    start, cpu = time.perf_counter(), time.process_time()
    transcript = transcriber.transcribe(
        audio, language=args.language, task=args.task, timestamps=args.timestamps,
        on_text=None if args.json or args.timestamps else show,
        on_segment=show_segment if args.timestamps and not args.json else None,
    )
    seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - cpu
    if args.json:
        print(json.dumps(transcript.to_json(), ensure_ascii=False))
    elif not args.timestamps:
        sys.stdout.write("\n")
    sys.stdout.flush()
    if not args.quiet:
        language = f", language {transcript.language}" if transcript.language else ""
        print(f"{path}: {audio.seconds:.2f} s of audio in {transcript.windows} window"
              f"{'s' * (transcript.windows != 1)}{language}; {seconds:.2f} s (CPU {cpu_seconds:.2f} s),"
              f" real-time factor {seconds / max(audio.seconds, 1e-9):.2f}", file=sys.stderr, flush=True)


def _clock(seconds: float) -> str:
    minutes, rest = divmod(seconds, 60.0)
    hours, minutes = divmod(int(minutes), 60)
    return (f"{hours:d}:" if hours else "") + f"{minutes:02d}:{rest:06.3f}"
