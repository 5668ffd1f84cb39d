"""Text tokens <-> SentencePiece pieces, as the reference shows and records them."""

from __future__ import annotations

from pathlib import Path

from personaplex_edge.errors import ModelDirError
from personaplex_edge.manifest import Manifest
from personaplex_edge.streams import TEXT_EPAD, TEXT_PAD

_WORD_START = "\u2581"  # SentencePiece's marker of a piece that starts a word


class TextTokenizer:
    def __init__(self, model_dir: str | Path, manifest: Manifest):
        import sentencepiece as spm

        if manifest.tokenizer is None:
            raise ModelDirError(f"{model_dir} has no text tokenizer (re-export from a checkpoint "
                                "with tokenizer_spm_32k_3.model)")
        self.sp = spm.SentencePieceProcessor(model_file=str(Path(model_dir) / manifest.tokenizer))
        self.size = self.sp.get_piece_size()

    def encode(self, text: str) -> list[int]:
        """Plain pieces: no BOS/EOS, as the reference encodes its text prompts."""
        return list(self.sp.encode(text))

    def piece(self, token: int) -> str:
        """The text a token adds to the transcript ('' for padding and ids the tokenizer lacks)."""
        if token in (TEXT_PAD, TEXT_EPAD) or not 0 <= token < self.size:
            return ""
        return self.sp.id_to_piece(token).replace(_WORD_START, " ")

    def record(self, token: int | None) -> str:
        """One entry of the offline tool's per-frame JSON: "PAD", "EPAD" or the piece."""
        if token is None or token == TEXT_PAD:
            return "PAD"
        if token == TEXT_EPAD:
            return "EPAD"
        if not 0 <= token < self.size:
            return ""
        return self.sp.id_to_piece(token).replace(_WORD_START, " ")
