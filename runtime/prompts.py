"""The persona prefill, as the reference (NVIDIA's PersonaPlex) runs it, laid out as columns.

Prompt phases are teacher-forced frames, in this order:

    voice prompt    V frames: text PAD, agent = the voice's Mimi codes, user = SINE_TOKENS
                    (or, from the voice bank, N stored input embeddings + a token cache)
    silence         6 frames: text PAD, agent = SILENCE_TOKENS, user = SINE_TOKENS
    text prompt     one frame per SentencePiece token of "<system> {prompt} <system>":
                    text = the token, agent = SILENCE_TOKENS, user = SINE_TOKENS
    silence         6 frames, as above

Forced frames go through the same delays as live tokens: frame f's text and codebook-0 tokens
land in column f, its acoustic codebooks in column f + 1, and a column c <= delay holds the
initial token. Nothing is sampled from prompt frames, so the prefill is a fixed list of columns
known in advance; only the temporal transformer runs on them, to fill the KV ring.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from personaplex_edge.streams import (AGENT_FIRST, DELAYS, NUM_STREAMS, SILENCE_TOKENS,
                                      SINE_TOKENS, TEXT_PAD, TEXT_STREAM, USER_FIRST, ZERO_TOKEN)

SILENCE_FRAMES = 6  # 0.5 s at 12.5 Hz, before and after the text prompt
SYSTEM_TAG = "<system>"


def wrap_text_prompt(prompt: str) -> str:
    cleaned = prompt.strip()
    if cleaned.startswith(SYSTEM_TAG) and cleaned.endswith(SYSTEM_TAG):
        return cleaned
    return f"{SYSTEM_TAG} {cleaned} {SYSTEM_TAG}"


def prompt_frames(text_tokens: list[int], voice_codes: np.ndarray | None = None
                  ) -> list[np.ndarray]:
    """The forced frames of a persona, in the reference's order: the voice's agent codes
    ([V, 8], a recorded voice; a bank voice is stored embeddings instead, see build_prefill),
    silence, one frame per text prompt token (already wrapped and encoded), silence."""
    frames = [forced_frame(TEXT_PAD, codes) for codes in
              (voice_codes if voice_codes is not None else [])]
    silence = [forced_frame(TEXT_PAD, SILENCE_TOKENS)] * SILENCE_FRAMES
    return frames + silence + [forced_frame(t, SILENCE_TOKENS) for t in text_tokens] + silence


def forced_frame(text: int, agent, user=SINE_TOKENS) -> np.ndarray:
    """[17] int64: one prompt frame, undelayed."""
    frame = np.empty(NUM_STREAMS, np.int64)
    frame[TEXT_STREAM] = text
    frame[AGENT_FIRST:USER_FIRST] = agent
    frame[USER_FIRST:] = user
    return frame


@dataclass
class Prefill:
    """Columns for the temporal transformer at positions 0..len-1, then the column that waits
    for the first live step.

    `columns[i]` [17] feeds position i; `embeddings[i]` ([D] or None) is added to (for stored
    voice prompts: replaces, the tokens being ZERO_TOKEN) its token embedding. `pending` [17] is
    column len's delayed entries (the acoustic codebooks of the last prompt frame); its other
    entries are -2 (written by the live step)."""

    columns: list[np.ndarray] = field(default_factory=list)
    embeddings: list[np.ndarray | None] = field(default_factory=list)
    pending: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.columns)


def build_prefill(initial: np.ndarray, frames: list[np.ndarray],
                  voice_embeddings: np.ndarray | None = None,
                  voice_cache: np.ndarray | None = None) -> Prefill:
    """Lays forced `frames` ([17] each, undelayed) out as delayed columns.

    With a stored voice prompt (`voice_embeddings` [N, D], `voice_cache` [17, S] as saved by the
    reference, a ring of S columns indexed by absolute column number), positions 0..N-1 take
    the embeddings, column N comes from the cache and its delayed successor seeds the frames."""
    delays = np.asarray(DELAYS)
    prefill = Prefill()
    start = 0
    previous = None  # the frame before the current one, for the delayed streams
    if voice_embeddings is not None:
        n = voice_embeddings.shape[0]
        slots = voice_cache.shape[-1]
        zero = np.full(NUM_STREAMS, ZERO_TOKEN, np.int64)
        for i in range(n):
            prefill.columns.append(zero)
            prefill.embeddings.append(voice_embeddings[i])
        prefill.columns.append(voice_cache[:, n % slots].astype(np.int64))
        prefill.embeddings.append(None)
        # the delayed entries of column n + 1: what the cache holds for them
        previous = np.where(delays > 0, voice_cache[:, (n + 1) % slots], ZERO_TOKEN)
        start = n + 1
    for f, frame in enumerate(frames):
        c = start + f
        delayed = frame if previous is None else previous
        column = np.where(c <= delays, initial, np.where(delays > 0, delayed, frame))
        prefill.columns.append(column.astype(np.int64))
        prefill.embeddings.append(None)
        previous = frame
    if previous is not None:
        prefill.pending = np.where(delays > 0, previous, -2).astype(np.int64)
    return prefill
