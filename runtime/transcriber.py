"""The transcriber's rows of a lockstep batch: one step of Kyutai's STT per frame, on the codes
the batch's Mimi encode already made (the first 8 are PersonaPlex's, all n_q the
transcriber's: no second encode).

Per row it keeps what the step reads besides the codes - its own position and the text token it
chose last - and the HeardStream that turns its tokens into words and turns (heard.py).

    reset(row)        the step Kyutai's reference runs first, on the initial tokens alone
                      (moshi's run_inference feeds the first frame twice: its first step reads
                      no codes); the KV ring's slot 0 and the first text token come from it
    step(rows, codes) codes [B, >= n_q] -> per row: the text token (one per frame, as
                      `run --user-text-out` records it), the VAD heads' probabilities, the
                      Heard events it completes
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from personaplex_edge.contract import POSITION, TEXT_TOKEN, TOKENS, TRANSCRIBER_STEP, VAD
from personaplex_edge.transcriber import TURN_HEAD, TranscriberConfig

from .heard import Heard, HeardStream

if TYPE_CHECKING:
    from .model import LoadedModel


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
        self.frame_rate = model.sample_rate / model.frame_size
        self.streams = [self._stream() for _ in range(self.batch)]

    def _stream(self) -> HeardStream:
        cfg = self.cfg
        return HeardStream(self.text.piece, 1.0 / self.frame_rate, cfg.audio_delay_seconds,
                           cfg.delay_frames(self.frame_rate), vad=cfg.vad_heads > TURN_HEAD,
                           padding=(cfg.text_padding_id, cfg.end_of_padding_id))

    def reset(self, row: int) -> None:
        """`row` from the start: the first step on the initial tokens (module docstring)."""
        self._tokens[row] = self._initial
        self._position[row] = 0
        out = self.graph.run([row])
        self.last[row] = out[TEXT_TOKEN][row]
        self.position[row] = 1
        self.token[row], self.vad[row] = None, None
        self.events[row] = []
        self.streams[row] = self._stream()

    def step(self, rows: list[int], codes: np.ndarray) -> None:
        """One frame for `rows`, codes [B, >= n_q] int64 (the batch's encode)."""
        n = self.cfg.num_audio_codebooks
        for b in rows:
            self._tokens[b, 0, 0] = self.last[b]
            self._tokens[b, 0, 1:] = codes[b, :n]
            self._position[b] = self.position[b]
        out = self.graph.run(rows)
        text, vad = out[TEXT_TOKEN], out.get(VAD)
        for b in rows:
            token = int(text[b])
            self.last[b] = token
            self.position[b] += 1
            self.token[b] = token
            heads = None if vad is None else vad[b].copy()
            self.vad[b] = heads
            turn = None if heads is None or len(heads) <= TURN_HEAD else float(heads[TURN_HEAD, 0])
            self.events[b] += self.streams[b].feed(token, turn)

    def take_events(self, row: int) -> list[Heard]:
        events = self.events[row]
        if events:
            self.events[row] = []
        return events

    def close(self) -> None:
        self.graph.close()
