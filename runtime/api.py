"""The public Python API (`import personaplex_edge as pe`): a model loaded once, conversations
on it, 80 ms of speech in and out per step.

    import personaplex_edge as pe

    model = pe.load("demo")                        # a model directory or a built-in name
    with model.conversation(text_prompt="You enjoy having a good conversation.",
                            voice="NATF2", seed=1) as conv:
        for pcm_out, text in conv.stream(pcm):      # pcm: float32 at 24 kHz, any length
            ...
        conv.say("Your tea is ready.")              # spoken in the persona's voice, from
                                                    # the next step on (docs/say.md)

A `Model` is read-only and shared: its graphs, tokenizer and voice bank are loaded once, and
any number of conversations run on it (from different threads, or stepped together on a model
exported with `--batch B`). A `Conversation` owns its state; `close()` (or leaving its `with`
block) gives its row back. Every error a caller can act on is a `PersonaPlexError` whose
message names the fix.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import TYPE_CHECKING, AsyncIterable, AsyncIterator, Callable, Iterable, Iterator

import numpy as np

from personaplex_edge.contract import AUDIO_NOISE, DEPFORMER_STEP, HELIUM_STEP, TEXT_NOISE
from personaplex_edge.errors import AudioError

from . import conversation as core
from .lockstep import LockstepPool
from .model import LoadedModel
from .pcm_frames import frame_at, frame_count
from .persona import DEFAULT_TEXT_PROMPT, Persona
from .persona_cache import PersonaCache
from .response import Response, ResponseBuilder
from .sampling import SamplingParams
from .words.heard import Heard
from .words.say import SayEvent, SayPlan, Utterance

if TYPE_CHECKING:
    from .audio_io.duplex import DuplexLoop
    from .metrics import FrameMetrics
    from .words.text import TextTokenizer

__all__ = ["Conversation", "Heard", "Model", "Response", "SayEvent", "Utterance", "load"]

Progress = Callable[[str], None]
_SAMPLING = SamplingParams()  # the reference's defaults


def load(model: str | Path, device: str = "auto", threads: int | None = None, *,
         progress: Progress | None = None, persona_cache_mb: float = 256,
         persona_cache_dir: str | Path | None = None) -> "Model":
    """Loads a model once for any number of conversations.

    model: a model directory (`personaplex-edge export ... --out DIR`), an exported model on
    the Hugging Face hub (`OWNER/NAME[@REVISION]`: fetched into huggingface_hub's cache,
    checked against its manifest, reused after), or a built-in name (`demo`, `tiny`: random
    weights, exported on first use). device: "auto" (an NVIDIA GPU where its backend works,
    else a WebGPU GPU, else the CPU), "cpu", "cuda" or "webgpu". threads: onnxruntime's threads
    (default: PERSONAPLEX_THREADS, else every core). progress: called with one line per step of
    a long load (a first export, an engine build); silent by default. The persona cache keeps
    prefilled personas, at most `persona_cache_mb` MB in memory, and in `persona_cache_dir`
    across runs when given.

        >>> model = pe.load("demo", device="cpu")
    """
    from personaplex_edge.model_ref import resolve_model

    say = progress or (lambda line: None)
    cache = PersonaCache.sized(persona_cache_mb, persona_cache_dir, say)
    return Model.load(resolve_model(str(model), say), device=device, threads=threads,
                      progress=say, persona_cache=cache)


class Model:
    """A loaded model and the conversations on it; made by `pe.load`."""

    def __init__(self, loaded: LoadedModel, persona_cache: PersonaCache | None = None):
        self.loaded = loaded
        self.pool = LockstepPool(loaded)
        self.persona_cache = PersonaCache() if persona_cache is None else persona_cache

    @classmethod
    def load(cls, model_dir: str | Path, device: str = "auto", threads: int | None = None,
             progress: Progress | None = None,
             persona_cache: PersonaCache | None = None) -> "Model":
        """A model directory, loaded (`pe.load` also takes built-in names)."""
        return cls(LoadedModel.load(model_dir, device, threads, progress), persona_cache)

    # -- what the model is ------------------------------------------------------------------
    @property
    def model_dir(self) -> Path:
        """The model directory the graphs were loaded from."""
        return self.loaded.model_dir

    @property
    def sample_rate(self) -> int:
        """Hz of the audio in and out (24000)."""
        return self.loaded.sample_rate

    @property
    def frame_size(self) -> int:
        """Samples per step (1920: 80 ms at 24 kHz)."""
        return self.loaded.frame_size

    @property
    def batch(self) -> int:
        """Conversations one graph call steps (the export's --batch)."""
        return self.loaded.batch

    @property
    def context(self) -> int:
        """Frames of the past the model attends to (older ones slide out of its window)."""
        return self.loaded.context

    @property
    def manifest(self):
        """The model directory's manifest (graphs, state, precision, voice bank)."""
        return self.loaded.manifest

    @property
    def config(self):
        """The model's PersonaPlexConfig (the seed's layout)."""
        return self.loaded.config

    @property
    def top_k_max(self) -> tuple[int, int]:
        """(text, audio): the largest top-k the model's graphs were exported with."""
        graphs = self.manifest.graphs

        def last_dim(graph: str, name: str) -> int:
            return next(t for t in graphs[graph].inputs if t.name == name).shape[-1]
        return last_dim(HELIUM_STEP, TEXT_NOISE), last_dim(DEPFORMER_STEP, AUDIO_NOISE)

    @property
    def runs_on(self) -> list[str]:
        """What computes the graphs, e.g. ['onnxruntime-cpu']."""
        return self.loaded.runs_on

    @property
    def device(self) -> str:
        """The same in words, with the WebGPU adapter where there is one."""
        return self.loaded.device

    @property
    def text(self) -> "TextTokenizer":
        """The text tokenizer (refused, with the fix, for a model exported without one)."""
        return self.loaded.text

    def voices(self) -> list[str]:
        """The names of the model's voice bank, e.g. ['NATF0', ..., 'VARM4']."""
        return self.loaded.voices()

    @property
    def open_conversations(self) -> int:
        """Conversations open on the model now."""
        return self.pool.occupied

    # -- conversations ----------------------------------------------------------------------
    def conversation(self, text_prompt: str | None = DEFAULT_TEXT_PROMPT,
                     voice: str | Path | None = None, *, persona: bool = True,
                     greedy: bool = False, seed: int | None = None,
                     temp: float = _SAMPLING.temp, temp_text: float = _SAMPLING.temp_text,
                     top_k: int = _SAMPLING.top_k,
                     top_k_text: int = _SAMPLING.top_k_text) -> "Conversation":
        """A new conversation, its persona run (or restored from the persona cache) so that
        its first step answers as the persona; the defaults are `personaplex-edge run`'s.

        text_prompt: the persona's role. voice: a name of the voice bank (`NATF2`, see
        `voices()`; the default is NATF2 where the bank has it) or an audio file to imitate.
        persona=False skips every prompt. greedy: argmax instead of sampling; seed: the
        sampling noise's seed (the same seed gives the same answer). temp / top_k: audio
        sampling; temp_text / top_k_text: text sampling.

            >>> with model.conversation(voice="NATM1", seed=3) as conv:
            ...     pcm_out, text = conv.step(frame)
        """
        sampling = SamplingParams(temp=temp, temp_text=temp_text, top_k=top_k,
                                  top_k_text=top_k_text, greedy=greedy, seed=seed)
        chosen = Persona(text_prompt=text_prompt, voice=None if voice is None else str(voice),
                         enabled=persona)
        self.text  # prompts and answers need it: a model without one is refused before a row
        conv = self.open_conversation(sampling, chosen)
        try:
            frames = conv.prefill()
        except BaseException:
            conv.close()
            raise
        return Conversation(self, conv, frames)

    def open_conversation(self, sampling: SamplingParams = SamplingParams(),
                          persona: Persona = Persona()) -> core.Conversation:
        """The token-level conversation the front ends step (its persona not yet run: call
        its `prefill()`); `step` returns the text token id, and `step_many` steps several in
        one lockstep tick. Apps want `conversation()`."""
        return core.Conversation(self.pool, sampling, persona, self.persona_cache)

    def close(self) -> None:
        """Lets every conversation's buffers and the sessions go now (device memory on a
        GPU); the model cannot be used after."""
        self.pool.close()
        self.loaded.close()

    def __enter__(self) -> "Model":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"Model({str(self.model_dir)!r}, batch={self.batch}, "
                f"runs_on={self.runs_on}, open_conversations={self.open_conversations})")


class Conversation:
    """One conversation on a `Model` (made by `model.conversation(...)`): 1920 samples of the
    user in, 1920 of the model out, per step."""

    def __init__(self, model: Model, conv: core.Conversation, prompt_frames: int = 0):
        self.model = model
        self.core = conv
        self.prompt_frames = prompt_frames  # the persona's frames, run or restored
        self.sample_rate = model.sample_rate
        self.frame_size = model.frame_size
        self._pieces: list[str] = []

    # -- one frame ----------------------------------------------------------------------------
    def step(self, pcm: np.ndarray, sample_rate: int | None = None) -> tuple[np.ndarray, str]:
        """pcm: float32 [1920] at 24 kHz (80 ms of the user) -> (float32 [1920]: 80 ms of the
        model, the text piece the model said in that frame, '' for none). Moshi's schedule:
        the first step answers the persona's last frame, or silence without a persona.

            >>> pcm_out, text = conv.step(np.zeros(1920, np.float32))
        """
        frame = self._frame(pcm, sample_rate)
        out, token = self.core.step(frame)
        return out.copy(), self._piece(token)

    async def astep(self, pcm: np.ndarray,
                    sample_rate: int | None = None) -> tuple[np.ndarray, str]:
        """`step` off the event loop (in its default executor), so an asyncio app goes on
        while the model computes."""
        frame = self._frame(pcm, sample_rate)
        loop = asyncio.get_running_loop()
        out, token = await loop.run_in_executor(None, self.core.step, frame)
        return out.copy(), self._piece(token)

    # -- many frames ----------------------------------------------------------------------------
    def stream(self, audio: np.ndarray | Iterable[np.ndarray],
               sample_rate: int | None = None) -> Iterator[tuple[np.ndarray, str]]:
        """A generator of (pcm_out, text) per frame: `audio` is either a whole signal (a 1-D
        array of any length, resampled from `sample_rate` and cut into frames, the last one
        padded with silence) or an iterable of 1920-sample frames (a microphone's blocks).

            >>> for pcm_out, text in conv.stream(pe.read_audio("question.wav")):
            ...     speaker.write(pcm_out)
        """
        for frame in self._frames(audio, sample_rate):
            out, token = self.core.step(frame)
            yield out.copy(), self._piece(token)

    async def astream(self, frames: AsyncIterable[np.ndarray] | Iterable[np.ndarray],
                      sample_rate: int | None = None
                      ) -> AsyncIterator[tuple[np.ndarray, str]]:
        """`stream` for asyncio: each frame of `frames` (an async or a plain iterable of
        1920-sample frames, or a whole signal) is stepped off the event loop."""
        if isinstance(frames, AsyncIterable):
            async for frame in frames:
                yield await self.astep(frame, sample_rate)
        else:
            for frame in self._frames(frames, sample_rate):
                yield await self.astep(frame)

    def respond(self, pcm: np.ndarray, sample_rate: int | None = None,
                say: Iterable[tuple[float, str]] = ()) -> Response:
        """A whole recording in, the model's answer out - exactly what `personaplex-edge run`
        writes for it: the input's length, time-aligned with it, and one text record per
        frame. say: (seconds, text) pairs, each text said from the step at that time into the
        recording (`run --say TEXT --say-at SECONDS`); times past its end are not reached.
        With a transcriber the recording is the user's whole input: its last words are heard
        to the end and its turn ends (flush_heard)."""
        built = ResponseBuilder(self._signal(pcm, sample_rate), self.frame_size, self.model.text,
                                heard_text=self.model.loaded.heard_text)
        plan = SayPlan(say, self.sample_rate / self.frame_size)
        kept = self.core.on_heard
        for i in range(built.frames):
            plan.say_due(i, self.say)
            answer, token = self.core.step(self._frame(built.frame(i)))
            if piece := built.add(i, answer, token):
                self._pieces.append(piece)
            if self.core.transcribing:
                events = [] if kept is not None else self.core.heard_events()
                built.hear([self.core.heard_token], events)
        if self.core.transcribing:
            tokens = self.core.flush_heard(built.padding)
            built.hear(tokens, [] if kept is not None else self.core.heard_events())
        return built.response()

    # -- words the app decides ------------------------------------------------------------------
    def say(self, text: str) -> Utterance:
        """The model says `text` in the persona's voice while the conversation goes on: its
        words are queued (after any still queued) and, from the next step on, fed to the
        model's text stream one by one, each when the model asks for a word. Events per word
        (started, done, cancelled) come from `say_events()` or `on_say`. The user speaking
        does not cancel them; `cancel_say()` does. Write numbers as words. Thread-safe.
        A text over 4096 characters, or one the queue cannot take, is refused (PersonaPlexError;
        docs/say.md, Limits).

            >>> conv.say("Your tea is ready.")
            Utterance(id=1, text='Your tea is ready.', words=('Your', 'tea', 'is', 'ready.'))
        """
        return self.core.say(text)

    def cancel_say(self) -> None:
        """Drops the words not started yet (each gets a "cancelled" event); the word being
        spoken ends at its end, then the model's own text resumes."""
        self.core.cancel_say()

    def say_events(self) -> list[SayEvent]:
        """The word events since the last call: "started" (with the step of its first
        token), "done", "cancelled"; `last` marks the end of its utterance."""
        return self.core.say_events()

    @property
    def on_say(self) -> Callable[[SayEvent], None] | None:
        """A callback for each word event instead of `say_events()`: it runs on the thread
        that steps, right after the step that made the event, or on the one that called
        `cancel_say()` for its "cancelled" events (keep it short)."""
        return self.core.on_say

    @on_say.setter
    def on_say(self, callback: Callable[[SayEvent], None] | None) -> None:
        self.core.on_say = callback

    @property
    def saying(self) -> bool:
        """Whether queued words steer the model's text now."""
        return self.core.saying

    # -- what the user says (a model exported with --transcriber) ---------------------------------
    @property
    def transcribing(self) -> bool:
        """Whether the model hears the user's words (its export added a transcriber)."""
        return self.core.transcribing

    def heard_events(self) -> list[Heard]:
        """What the user said since the last call: "piece" (what a piece adds to the turn's
        text, for live captions: a turn's pieces joined are its text), "word" (a finished word
        with its start and end in seconds), "turn" (the user's turn is over: its text). Each carries its turn's number (`item`). The
        words run about half a second behind the audio (docs/heard.md).

            >>> for e in conv.heard_events():
            ...     if e.kind == "turn": print("user:", e.text)
        """
        return self.core.heard_events()

    def end_turn(self) -> None:
        """Tells the conversation the user's turn is over (your own voice detector, a
        push-to-talk button): the "turn" event follows once the last words are written
        (about half a second). Without VAD heads this is how turns end early."""
        self.core.end_turn()

    def flush_heard(self, padding: int = 0) -> None:
        """The user's input is over (a file streamed to its end): the transcriber hears the
        silence moshi's STT inference pads after an input, so the words still inside its
        delay are written, and the turn ends; the model's answer is not stepped. `respond()`
        does it itself. `padding`: samples of silence the last frame was padded with.

            >>> for pcm_out, text in conv.stream(pe.read_audio("question.wav")): ...
            >>> conv.flush_heard()
        """
        self.core.flush_heard(padding)

    @property
    def on_heard(self) -> Callable[[Heard], None] | None:
        """A callback for each event of `heard_events()` instead: it runs on the thread that
        steps, right after the step that made it (keep it short)."""
        return self.core.on_heard

    @on_heard.setter
    def on_heard(self, callback: Callable[[Heard], None] | None) -> None:
        self.core.on_heard = callback

    # -- the sound devices ------------------------------------------------------------------------
    def live(self, on_text: Callable[[str], None] | None = None,
             on_audio: Callable[[np.ndarray, np.ndarray], None] | None = None, *,
             input_device: str | int | None = None, output_device: str | int | None = None,
             aec: bool = True, duration: float | None = None, max_backlog_frames: int = 2,
             on_tick: Callable[["DuplexLoop"], None] | None = None,
             progress: Progress | None = None) -> "DuplexLoop":
        """Talks through the sound devices (what `personaplex-edge --mic` runs) until
        `duration` seconds pass or Ctrl-C; returns the loop, whose `stats` count frames,
        drops and underruns.

        on_text(piece) is called with each piece the model says; on_audio(heard, said) with
        each frame the model heard (echo cancelled) and the frame it answered. Both run on the
        loop's worker thread, between two frames: keep them short (hand work to a queue).
        aec cancels the speaker's echo from the microphone (off for a headset). The oldest
        input is dropped when the machine falls behind, so latency stays bounded."""
        from .audio_io.devices import run_on_devices

        def step(frame: np.ndarray) -> np.ndarray:
            answer, token = self.core.step(frame)
            piece = self._piece(token)
            if piece and on_text is not None:
                on_text(piece)
            if on_audio is not None:
                on_audio(frame, answer)
            return answer

        self.core.check_open()
        return run_on_devices(step, input_device, output_device, duration=duration,
                              model_rate=self.sample_rate, frame_size=self.frame_size,
                              on_tick=on_tick, max_backlog_frames=max_backlog_frames, aec=aec,
                              step_metrics=self.core.metrics, progress=progress or print)

    # -- state --------------------------------------------------------------------------------
    @property
    def text(self) -> str:
        """Everything the model said so far."""
        return "".join(self._pieces).strip()

    @property
    def position(self) -> int:
        """Frames stepped since the start (the persona's included)."""
        return self.core.position

    @property
    def metrics(self) -> "FrameMetrics":
        """Per-stage milliseconds of each frame (encode, temporal, depformer, decode, ...)."""
        return self.core.metrics

    @property
    def persona_cached(self) -> bool:
        """Whether the persona came from the persona cache."""
        return self.core.persona_cached

    @property
    def closed(self) -> bool:
        """Whether close() was called (stepping then raises)."""
        return self.core.closed

    def close(self) -> None:
        """Gives the conversation's row back to the model; stepping after raises."""
        self.core.close()

    def __enter__(self) -> "Conversation":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- checks -------------------------------------------------------------------------------
    def _piece(self, token: int | None) -> str:
        if token is None:
            return ""
        piece = self.model.text.piece(token)
        if piece:
            self._pieces.append(piece)
        return piece

    def _check_rate(self, sample_rate: int | None) -> None:
        if sample_rate is not None and sample_rate != self.sample_rate:
            raise AudioError(f"a frame at {sample_rate} Hz: the model takes {self.sample_rate} "
                             "Hz; resample first (give the whole signal to stream() or "
                             "respond() with its sample_rate, or read files with pe.read_audio)")

    def _frame(self, pcm: np.ndarray, sample_rate: int | None = None) -> np.ndarray:
        """One frame as the graphs take it: float32 [1920], finite."""
        self.core.check_open()
        self._check_rate(sample_rate)
        a = np.asarray(pcm)
        if a.dtype.kind != "f":
            raise AudioError(f"a frame of {a.dtype} samples: give float32 in [-1, 1] (PCM16 "
                             "divided by 32768)")
        if a.size != self.frame_size or a.ndim > 1 and max(a.shape) != a.size:
            raise AudioError(f"a frame of shape {list(a.shape)}: a step takes {self.frame_size} "
                             f"samples (80 ms at {self.sample_rate} Hz), mono; give a longer "
                             "signal to stream() or respond(), which cut it into frames")
        frame = a.reshape(-1).astype(np.float32, copy=False)
        if not np.isfinite(frame).all():
            raise AudioError("a frame holds NaN or infinite samples")
        return frame

    def _signal(self, pcm: np.ndarray, sample_rate: int | None) -> np.ndarray:
        """A whole mono signal at the model's rate."""
        from personaplex_edge.audio import resample

        self.core.check_open()
        a = np.asarray(pcm)
        if a.ndim != 1 or a.dtype.kind != "f":
            raise AudioError(f"a signal of shape {list(a.shape)} and dtype {a.dtype}: give a "
                             "mono float32 array [samples] in [-1, 1]")
        return resample(a, sample_rate or self.sample_rate, self.sample_rate)

    def _frames(self, audio: np.ndarray | Iterable[np.ndarray],
                sample_rate: int | None = None) -> Iterator[np.ndarray]:
        """Frames of a whole signal (the last padded with silence), or of an iterable of
        frames, each checked."""
        if isinstance(audio, np.ndarray) and audio.ndim == 1:
            yield from self._cut(self._signal(audio, sample_rate))
            return
        for frame in audio:
            yield self._frame(frame, sample_rate)

    def _cut(self, signal: np.ndarray) -> Iterator[np.ndarray]:
        """A signal at the model's rate in frames, the last padded with silence."""
        for i in range(frame_count(signal.shape[0], self.frame_size)):
            yield self._frame(frame_at(signal, i, self.frame_size))
