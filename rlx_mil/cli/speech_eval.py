"""`rlx-mil eval SPEECH_FOLDER --audio FILES --reference CHECKPOINT`: a Whisper package folder
judged against the checkpoint it came from (`rlx_mil.speech.evaluate`)."""

from __future__ import annotations

import argparse
from typing import Any

from rlx_mil.errors import InvalidOptionError


def run_speech_eval(args: argparse.Namespace, progress: Any) -> int:
    """Print the check (text or --json); exit 0 whatever it found, as `eval` of a text does
    (`--verify` at conversion is what fails on quality)."""
    from rlx_mil.speech.evaluate import evaluate_speech, speech_folder_in

    if args.audio is None:
        raise InvalidOptionError(f"{args.package} is a speech package folder: give --audio FILE ... (and --reference"
                                 " CHECKPOINT), not a text")
    if args.text is not None:
        raise InvalidOptionError("--text is for a text decoder package; a speech folder is judged on --audio")
    if args.reference is None:
        raise InvalidOptionError("eval --audio needs --reference CHECKPOINT: the Whisper checkpoint folder the package"
                                 " was converted from (it is the model the package is judged against)")
    folder = speech_folder_in(args.package)

    def say(what: str) -> None:
        progress.begin(what)

    result = evaluate_speech(folder, args.audio, args.reference, language=args.language, max_tokens=args.max_tokens,
                             progress=say)
    progress.end("done")
    print(result.to_json() if args.json else result.to_text())
    return 0
