"""The text side of a conversation: tokens <-> SentencePiece pieces as the reference shows and
records them, and the transcript every front end (`run`, `--mic`, `serve`) keeps the same way."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

from personaplex_edge.atomic import write_text_atomic
from personaplex_edge.errors import ModelDirError
from personaplex_edge.manifest import Manifest
from personaplex_edge.streams import TEXT_EPAD, TEXT_PAD

_WORD_START = "\u2581"  # SentencePiece's marker of a piece that starts a word


class TextTokenizer:
    def __init__(self, model_dir: str | Path, manifest: Manifest, file: str | None = None,
                 pad: int = TEXT_PAD, epad: int = TEXT_EPAD):
        """The model's tokenizer, or the one `file` names (the transcriber's, with the padding
        ids its config gives)."""
        import sentencepiece as spm

        self.pad, self.epad = pad, epad  # "nothing this frame", "a word starts next frame"

        file = file or manifest.tokenizer
        if file is None:
            raise ModelDirError(f"{model_dir} has no text tokenizer (re-export from a checkpoint "
                                "with tokenizer_spm_32k_3.model)")
        self.sp = spm.SentencePieceProcessor(model_file=str(Path(model_dir) / file))
        self.size = self.sp.get_piece_size()

    def encode(self, text: str) -> list[int]:
        """Plain pieces: no BOS/EOS, as the reference encodes its text prompts."""
        return list(self.sp.encode(text))

    def piece(self, token: int | None) -> str:
        """The text a token adds to the transcript ('' for padding, None and ids the tokenizer
        lacks); SentencePiece's word marker becomes a space, as the protocol sends it."""
        if token is None or token in (self.pad, self.epad) or not 0 <= token < self.size:
            return ""
        return self.sp.id_to_piece(token).replace(_WORD_START, " ")

    def record(self, token: int | None) -> str:
        """One entry of the offline tool's per-frame JSON: "PAD", "EPAD" or the piece."""
        if token is None or token == self.pad:
            return "PAD"
        if token == self.epad:
            return "EPAD"
        return self.piece(token)


class Transcript:
    """What the model said: the pieces in order, optionally the per-frame records of the
    reference's offline tool (one entry per frame, PAD and EPAD included), and a callback per
    new piece (a live front end prints or sends it)."""

    def __init__(self, tokenizer: TextTokenizer, records: bool = False,
                 on_piece: Callable[[str], None] | None = None):
        self.tokenizer = tokenizer
        self.pieces: list[str] = []
        self.records: list[str] | None = [] if records else None
        self.on_piece = on_piece

    def add(self, token: int | None) -> str:
        """One frame's text token (None before the first complete frame) -> its piece."""
        if self.records is not None:
            self.records.append(self.tokenizer.record(token))
        piece = self.tokenizer.piece(token)
        if piece:
            self.pieces.append(piece)
            if self.on_piece is not None:
                self.on_piece(piece)
        return piece

    @property
    def text(self) -> str:
        return "".join(self.pieces).strip()


def write_records(path: str | Path, records: list[str]) -> None:
    """The reference offline tool's per-frame JSON (a list: the piece, "PAD" or "EPAD")."""
    write_text_atomic(Path(path), json.dumps(records, ensure_ascii=False))
