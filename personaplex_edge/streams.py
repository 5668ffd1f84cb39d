"""The 17 token streams and the per-frame token schedule, shared by export and runtime.

One frame = 80 ms. Every frame the temporal transformer reads one column of 17 tokens:

    stream 0        text (SentencePiece piece id)
    streams 1..8    agent audio, Mimi codebooks 0..7
    streams 9..16   user audio, Mimi codebooks 0..7

Acoustic codebooks (1..7 of each speaker) run one frame late (`DELAYS`), so within a frame the
depformer can predict codebook 0 of frame n together with codebooks 1..7 of frame n - 1.
`TokenRing` keeps the last few columns the way Moshi's own `LMGen` does, and says which column
feeds the next temporal step, where user codes go and where generated tokens go.

Torch-free on purpose: the runtime imports this.
"""

from __future__ import annotations

import numpy as np

# ---- stream layout ------------------------------------------------------------------------------
NUM_STREAMS = 17  # 1 text + 8 agent + 8 user
CODEBOOKS_PER_SPEAKER = 8  # Mimi codebooks used per speaker
TEXT_STREAM = 0
AGENT_FIRST = 1  # agent codebook k lives in stream AGENT_FIRST + k
USER_FIRST = AGENT_FIRST + CODEBOOKS_PER_SPEAKER  # user codebook k lives in stream USER_FIRST + k
AGENT_STREAMS = slice(AGENT_FIRST, USER_FIRST)
USER_STREAMS = slice(USER_FIRST, NUM_STREAMS)
# Streams the model produces itself each frame (text + the agent's codebooks).
GENERATED_STREAMS = slice(TEXT_STREAM, USER_FIRST)

# Delay of each stream in frames: text and both codebook-0 streams are on time, the acoustic
# codebooks 1..7 lag one frame.
DELAYS = (0,
          0, 1, 1, 1, 1, 1, 1, 1,
          0, 1, 1, 1, 1, 1, 1, 1)
MAX_DELAY = max(DELAYS)  # frames: how long a column takes to become complete

# ---- special token values -----------------------------------------------------------------------
ZERO_TOKEN = -1  # embeds to the zero vector (stream contributes nothing to the input)
UNGENERATED_TOKEN = -2  # slot not written yet; must never reach the model

# Text specials of the SentencePiece model (tokenizer_spm_32k_3.model).
TEXT_EPAD = 0  # end of padding: "a word starts next frame"; not shown to users
TEXT_BOS = 1
TEXT_EOS = 2
TEXT_PAD = 3  # nothing said this frame; fed as text during prompts; not shown to users

# Fixed Mimi frames (8 codes each) used during the prompt phases.
SILENCE_TOKENS = (948, 243, 1178, 546, 1736, 1030, 1978, 2008)  # agent channel: silence
SINE_TOKENS = (430, 1268, 381, 1611, 1095, 1495, 56, 472)  # user channel: a quiet sine tone


def initial_tokens(cfg) -> np.ndarray:
    """[17] int64: what each stream holds before its first real token. The initial ids are one
    past each vocabulary (the extra embedding row): text_vocab_size for text (32000) and
    audio_vocab_size for audio (2048). `cfg` is a PersonaPlexConfig."""
    out = np.full(NUM_STREAMS, cfg.audio_vocab_size, dtype=np.int64)
    out[TEXT_STREAM] = cfg.text_vocab_size
    return out


class TokenRing:
    """Moshi's generation schedule on a ring of the last `slots` token columns.

    `offset` counts temporal steps taken (it is also the position the next step runs at). One
    frame, with t = offset:

        ring.write_user(codes)        user codebook k lands in column t + delay_k
        tokens = ring.step_input()    column t, where streams with t <= delay still read their
                                      initial token (so frame 0 is all initial tokens)
        ... temporal step at position t, depformer ...
        ring.write_generated(text, agent_codes)
                                      offset becomes t + 1; text and all 8 agent codebooks land
                                      in column t + 1 (the depformer's codebooks 1..7 are already
                                      the delayed ones, i.e. belong to the frame before)
        ring.output()                 once offset > MAX_DELAY: the newest complete agent frame,
                                      undelayed: text and codebook 0 from column t (the previous
                                      step), codebooks 1..7 from column t + 1 (this step)

    So the agent's audio for frame n is ready right after step n + 1 (Moshi's own schedule).
    MAX_DELAY + 2 slots suffice: reads reach back to column t, writes ahead to t + MAX_DELAY.
    All rows of the batch advance together (one shared offset).
    """

    def __init__(self, cfg, batch: int = 1, slots: int = MAX_DELAY + 2):
        if slots < MAX_DELAY + 2:
            raise ValueError(f"the token ring needs at least {MAX_DELAY + 2} slots")
        self.batch = batch
        self.slots = slots
        self.initial = initial_tokens(cfg)  # [17]
        self.delays = np.asarray(DELAYS, dtype=np.int64)  # [17]
        self.tokens = np.empty((batch, NUM_STREAMS, slots), dtype=np.int64)  # [B, 17, slots]
        self.reset()

    def reset(self) -> None:
        self.tokens.fill(UNGENERATED_TOKEN)
        self.offset = 0
        self.origin = 0  # the first step's position (jump moves a ring that has not stepped)

    @property
    def position(self) -> int:
        """Absolute position of the next temporal step (grows forever; the KV ring wraps)."""
        return self.offset

    def write_user(self, codes: np.ndarray) -> None:
        """codes [B, 8]: the user's Mimi codes of the frame about to be stepped."""
        codes = np.asarray(codes, dtype=np.int64).reshape(self.batch, CODEBOOKS_PER_SPEAKER)
        for k in range(CODEBOOKS_PER_SPEAKER):
            s = USER_FIRST + k
            self.tokens[:, s, (self.offset + self.delays[s]) % self.slots] = codes[:, k]

    def step_input(self, out: np.ndarray | None = None) -> np.ndarray:
        """[B, 17] int64: the column the temporal step at `position` reads (written into `out`,
        e.g. a row of the graph's bound input, when given)."""
        column = self.tokens[:, :, self.offset % self.slots]  # [B, 17]
        if out is None:
            out = column.copy()
        else:
            out = out.reshape(column.shape)
            np.copyto(out, column)
        column = out
        not_started = self.offset - self.origin <= self.delays  # [17]
        column[:, not_started] = self.initial[not_started]
        if (column == UNGENERATED_TOKEN).any():
            raise RuntimeError(f"step {self.offset} would read a token that was never written: "
                               "write_user must come before step_input every frame")
        return column

    def write_generated(self, text: np.ndarray, agent: np.ndarray) -> None:
        """text [B] and agent codes [B, 8] from this step (sampled, or forced during prompts);
        advances the ring by one frame."""
        self.offset += 1
        col = self.offset % self.slots
        self.tokens[:, TEXT_STREAM, col] = np.asarray(text, dtype=np.int64).reshape(self.batch)
        self.tokens[:, AGENT_STREAMS, col] = np.asarray(agent, dtype=np.int64).reshape(
            self.batch, CODEBOOKS_PER_SPEAKER)

    def jump(self, position: int) -> None:
        """Goes on at `position` as if every frame between had run: the columns the ring holds
        keep their places relative to the next step. A benchmark starts a conversation deep in
        its context this way (`bench --position`) instead of stepping there."""
        if position < self.offset:
            raise ValueError(f"the ring is at {self.offset} already; it cannot go back to "
                             f"{position}")
        if self.offset == self.origin:  # nothing stepped yet: the conversation starts there
            self.origin = position
        self.tokens[...] = np.roll(self.tokens, position - self.offset, axis=2)
        self.offset = position

    def output(self) -> np.ndarray | None:
        """[B, 9] int64 (text, agent cb0..7) of the newest complete frame, or None while the
        first frame is not complete yet (the first MAX_DELAY steps)."""
        if self.offset - self.origin <= MAX_DELAY:
            return None
        gen = self.delays[GENERATED_STREAMS]  # [9]
        cols = (self.offset - MAX_DELAY + gen) % self.slots  # [9]
        return self.tokens[:, np.arange(USER_FIRST), cols].copy()
