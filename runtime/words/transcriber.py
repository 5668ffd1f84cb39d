"""The transcriber's rows of a lockstep batch: one step of Kyutai's STT per frame, on the codes
the batch's Mimi encode already made (the first 8 are PersonaPlex's, all n_q the
transcriber's: no second encode).

A transcriber whose reference feeds silence before the user's audio (stt_config's
`audio_silence_prefix_seconds`: 1 s for stt-2.6b-en, none for stt-1b-en_fr) hears it here too:
at each row's start its step runs on the codes of that silence's whole frames, and since 1 s
is 12.5 frames, its frames then straddle the user's - each holds the last `shift` samples of
the one before and the first 1920 - `shift` of this one. Its Mimi state is no longer
PersonaPlex's, so it encodes with its own binding of the encoder graph (one more encode per
frame, only for such a transcriber).

Per row it keeps what the step reads besides the codes - its own position and the text token it
chose last - and the HeardStream that turns its tokens into words and turns (heard.py).

    reset(row)        the step Kyutai's reference runs first, on the initial tokens alone
                      (moshi's run_inference feeds the first frame twice: its first step reads
                      no codes); the KV ring's slot 0 and the first text token come from it
    step(rows, codes) codes [B, >= n_q] -> per row: the text token (one per frame, as
                      `run --user-text-out` records it), the VAD heads' probabilities, the
                      Heard events it completes
    flush(row, ...)   the row's input is over: moshi's STT inference pads the audio with
                      `audio_delay_seconds` + 1 s of silence and keeps stepping, so the words
                      still inside the delay are written; the row steps on those silent frames
                      (encoded from the Mimi state the input left, PersonaPlex's untouched),
                      and its turn ends
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Mapping

import numpy as np

from personaplex_edge.contract import (CODES, MIMI_ENCODER, PCM, POSITION, TEXT_TOKEN, TOKENS,
                                       TRANSCRIBER_STEP, VAD)
from personaplex_edge.transcriber import TURN_HEAD, TranscriberConfig

from .heard import Heard, HeardStream

if TYPE_CHECKING:
    from ..backends import Graph
    from ..model import LoadedModel

# seconds of silence moshi's run_inference pads after an STT model's input, beyond its delay
FLUSH_SECONDS = 1.0


class TranscriberRows:
    def __init__(self, model: "LoadedModel"):
        self.cfg: TranscriberConfig = model.manifest.transcriber
        self.graph = model.graphs[TRANSCRIBER_STEP].bind()
        self.batch = self.graph.batch
        self.text = model.heard_text
        self._tokens, self._position = self.graph.inputs[TOKENS], self.graph.inputs[POSITION]
        self._initial = np.array(self.cfg.initial_tokens(), np.int64)  # [1 + n_q]
        self.position = np.zeros(self.batch, np.int64)  # the next step's position, per row
        self.last = np.zeros(self.batch, np.int64)  # the text token each row chose last
        self.token: list[int | None] = [None] * self.batch  # this frame's token, per row
        # [heads, classes] per row: the VAD heads' softmax (class 0: no voice ahead)
        self.vad: list[np.ndarray | None] = [None] * self.batch
        self.events: list[list[Heard]] = [[] for _ in range(self.batch)]
        self.sample_rate = model.sample_rate
        self.frame_rate = model.sample_rate / model.frame_size
        # the silence before the user's audio, as the reference pads it (module docstring)
        prefix = int(self.cfg.audio_silence_prefix_seconds * model.sample_rate)
        self.prefix_frames, self.shift = divmod(prefix, model.frame_size)
        self._encoder_graph = model.graphs[MIMI_ENCODER]
        self.encoder = self._encoder_graph.bind() if prefix else None
        self._codec_copy: "Graph | None" = None  # without a prefix: what a flush encodes with
        self._carry = np.zeros((self.batch, self.shift), np.float32)  # [B, shift]
        self.frame_size = model.frame_size
        self.streams = [self._stream() for _ in range(self.batch)]

    def _stream(self) -> HeardStream:
        cfg = self.cfg
        # a frame that straddles two of the user's starts `shift` samples earlier
        delay = cfg.audio_delay_seconds + self.shift / self.sample_rate
        return HeardStream(self.text, 1.0 / self.frame_rate, delay,
                           cfg.delay_frames(self.frame_rate), vad=cfg.vad_heads > TURN_HEAD)

    def reset(self, row: int) -> None:
        """`row` from the start: the first step on the initial tokens (module docstring), then
        the silence its reference feeds first."""
        self._tokens[row] = self._initial
        self._position[row] = 0
        out = self.graph.run([row])
        self.last[row] = out[TEXT_TOKEN][row]
        self.position[row] = 1
        if self.encoder is not None:
            self.encoder.reset([row])
            self.encoder.inputs[PCM][row] = 0.0
            self._carry[row] = 0.0
            for _ in range(self.prefix_frames):
                self._run([row], self.encoder.run([row])[CODES])
        self.token[row], self.vad[row] = None, None
        self.events[row] = []
        self.streams[row] = self._stream()

    def _run(self, rows: list[int], codes: np.ndarray) -> dict[str, np.ndarray]:
        """The step on codes [B, >= n_q]: each row's text token kept for its next step."""
        n = self.cfg.num_audio_codebooks
        for b in rows:
            self._tokens[b, 0, 0] = self.last[b]
            self._tokens[b, 0, 1:] = codes[b, :n]
            self._position[b] = self.position[b]
        out = self.graph.run(rows)
        for b in rows:
            self.last[b] = out[TEXT_TOKEN][b]
            self.position[b] += 1
        return out

    def _own_codes(self, rows: list[int], frames: Mapping[int, np.ndarray]) -> np.ndarray:
        """The frames this transcriber hears (module docstring), encoded: codes [B, n_q]."""
        pcm = self.encoder.inputs[PCM]  # [B, 1, frame]
        cut = pcm.shape[-1] - self.shift
        for b in rows:
            frame = frames[b].reshape(-1)
            pcm[b, 0, :self.shift] = self._carry[b]
            pcm[b, 0, self.shift:] = frame[:cut]
            self._carry[b] = frame[cut:]
        return self.encoder.run(rows)[CODES]

    def step(self, rows: list[int], codes: np.ndarray,
             frames: Mapping[int, np.ndarray]) -> None:
        """One frame for `rows`: codes [B, >= n_q] int64 (the batch's encode) and the frames
        it encoded (row -> pcm [1920]), which a transcriber with a silence prefix encodes
        itself."""
        if self.encoder is not None:
            codes = self._own_codes(rows, frames)
        out = self._run(rows, codes)
        for b in rows:
            self._hear(b, out)

    def _hear(self, b: int, out: Mapping[str, np.ndarray]) -> int:
        """Row b's token of the step's `out`, its VAD heads and the events they complete."""
        vad = out.get(VAD)
        token = int(out[TEXT_TOKEN][b])
        self.token[b] = token
        heads = None if vad is None else vad[b].copy()
        self.vad[b] = heads
        turn = None if heads is None or len(heads) <= TURN_HEAD else float(heads[TURN_HEAD, 0])
        self.events[b] += self.streams[b].feed(token, turn)
        return token

    def flush_frames(self, padding: int = 0) -> int:
        """The silent frames moshi steps after an input whose last frame held `padding`
        samples of silence already: its pad (the delay and FLUSH_SECONDS) in whole frames of
        what this row's frames have not yet covered (the carry of a straddling prefix)."""
        pad = int((self.cfg.audio_delay_seconds + FLUSH_SECONDS) * self.sample_rate)
        return max(0, (self.shift + pad - padding) // self.frame_size)

    def flush(self, row: int, padding: int, codec: "Graph") -> list[int]:
        """Row `row`'s input is over (module docstring): its step on the silent frames
        flush_frames(padding) counts, then its turn ended. `codec`: the batch's encoder, whose
        state for the row the silence continues from (read, never written). -> the token of
        each silent frame."""
        n = self.flush_frames(padding)
        silence = np.zeros(self.frame_size, np.float32)
        tokens = []
        if n and self.encoder is None:  # the batch's encoder is PersonaPlex's: a copy goes on
            if self._codec_copy is None:
                self._codec_copy = self._encoder_graph.bind()
            self._codec_copy.set_state(codec.state([row]), [row])
        for _ in range(n):
            if self.encoder is not None:
                codes = self._own_codes([row], {row: silence})
            else:
                self._codec_copy.inputs[PCM][row] = 0.0
                codes = self._codec_copy.run([row])[CODES]
            tokens.append(self._hear(row, self._run([row], codes)))
        self.events[row] += self.streams[row].end_turn()
        return tokens

    def take_events(self, row: int) -> list[Heard]:
        events = self.events[row]
        if events:
            self.events[row] = []
        return events

    def close(self) -> None:
        self.graph.close()
        for encoder in (self.encoder, self._codec_copy):
            if encoder is not None:
                encoder.close()
