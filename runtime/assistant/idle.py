"""Sleep when nobody speaks, wake on a voice: the step the assistant's duplex loop runs.

    awake   frame -> the conversation's step -> answer; a voice detector on both sides (the
            echo-cancelled microphone, and what the model said) restarts the idle clock
    asleep  frame -> the voice detector only (the LM is not stepped) -> silence; the last
            `preroll` frames are kept, so a wake steps the LM over the user's first words
            before the frame that woke it

Idle time is counted in frames (80 ms of audio each), so it pauses while no device delivers.

The policy across a sleep: each wake begins a new conversation from the cached persona. The
persona lives in the first slots of the LM's KV ring, which a conversation overwrites after
`context` frames (4 minutes for PersonaPlex-7B): a conversation kept across sleeps would
forget who it is and keep a minute of silence in its window. The new conversation is made when
the model falls asleep (the persona restored from the persona cache, its last column run), so
the wake itself costs only the pre-roll's steps; a persona changed by a reload (SIGHUP)
applies there too.

Words an app has the model say (`say`, runtime/words/say.py) wake it, and keep it awake until the
last of them is spoken: the model must step to speak them. A sleep's new conversation starts
with an empty queue.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

import numpy as np

from personaplex_edge.errors import PersonaPlexError

from ..persona import Persona
from .vad import voice_detector

if TYPE_CHECKING:
    from ..conversation import Conversation
    from ..words.heard import Heard
    from ..sampling import SamplingParams
    from ..words.say import SayEvent, Utterance
    from ..words.text import TextTokenizer

Emit = Callable[[dict], None]  # an event for the control socket and the log (thread-safe)

SPEAKING_HANG_FRAMES = 6  # "speaking" lasts this long past the model's last voiced frame


@dataclass(frozen=True)
class IdlePolicy:
    sleep_after_frames: int = 750  # 60 s; 0: never sleep
    wake_frames: int = 1  # speech frames in a row that wake the model
    preroll_frames: int = 4  # frames before the wake the model hears (the wake's included)
    aggressiveness: int = 3  # webrtc's
    voiced_subframes: int = 2
    vad: str = "webrtc"  # or "silero"
    vad_threshold: float = 0.5  # silero's
    silero_model: str | None = None

    @classmethod
    def from_seconds(cls, sleep_after: float, preroll_ms: int, frame_ms: float = 80.0,
                     **kw) -> "IdlePolicy":
        return cls(sleep_after_frames=int(round(sleep_after * 1000 / frame_ms)),
                   preroll_frames=max(1, int(-(-preroll_ms // frame_ms))), **kw)


@dataclass
class IdleStats:
    lm_frames: int = 0  # frames the LM stepped (live and pre-roll)
    asleep_frames: int = 0  # frames only the voice detector heard
    muted_frames: int = 0
    sleeps: int = 0
    wakes: int = 0
    conversations: int = 1
    preroll_frames: int = 0  # frames of the user's first words stepped at wakes
    wake_latency_frames: list[int] = field(default_factory=list)  # the last few wakes by voice

    def to_json(self) -> dict:
        return {k: (v[-20:] if isinstance(v, list) else v) for k, v in self.__dict__.items()}


class _Preroll:
    """The newest `capacity` frames, in order, in a buffer allocated once."""

    def __init__(self, capacity: int, frame_size: int):
        self.buf = np.zeros((capacity, frame_size), np.float32)  # [preroll, frame]
        self.count = 0  # frames pushed since the last clear

    def push(self, frame: np.ndarray) -> None:
        self.buf[self.count % self.buf.shape[0]] = frame
        self.count += 1

    def frames(self):
        """Oldest first (views: valid until the next push)."""
        n = min(self.count, self.buf.shape[0])
        for i in range(self.count - n, self.count):
            yield self.buf[i % self.buf.shape[0]]

    def clear(self) -> None:
        self.count = 0


class IdleGate:
    """The FrameStep (pcm [frame] -> pcm [frame]) between the duplex loop and a conversation.
    Commands (`request`, `muted`, `set_persona`) may come from any thread: each is read by
    the loop's worker at its next frame."""

    def __init__(self, conv: "Conversation", text: "TextTokenizer", policy: IdlePolicy,
                 emit: Emit = lambda event: None, frame_size: int = 1920,
                 sample_rate: int = 24000):
        self.conv = conv
        self.text = text
        self.policy = policy
        self.emit = emit
        self.stats = IdleStats()
        self.user_vad, self.model_vad = (
            voice_detector(policy.vad, policy.aggressiveness, policy.voiced_subframes,
                           policy.vad_threshold, policy.silero_model, sample_rate, frame_size)
            for _ in range(2))
        self._preroll = _Preroll(policy.preroll_frames, frame_size)
        self._silence_in = np.zeros(frame_size, np.float32)
        self._silence_out = np.zeros(frame_size, np.float32)
        self.frame = 0  # frames the gate was handed
        self.asleep = False
        self.state = "listening"  # listening | speaking | asleep
        self.muted = False
        self.heartbeat = time.monotonic()  # the worker's last frame: the watchdog reads it
        self._last_speech = 0  # frame of the last voice on either side
        self._last_model_speech = -SPEAKING_HANG_FRAMES
        self._run = 0  # speech frames in a row while asleep
        self._onset = 0
        self._requests: set[str] = set()
        self._next: tuple[Persona, SamplingParams | None] | None = None  # set_persona's
        conv.on_say = self._said  # word events, on the worker's thread after its step
        if conv.transcribing:  # what the user says, from a model with a transcriber
            conv.on_heard = self._heard

    # -- commands (any thread) ----------------------------------------------------------------
    def request(self, what: str) -> None:
        """"sleep" or "wake" at the next frame."""
        self._requests.add(what)

    def say(self, text: str) -> "Utterance":
        """Queues `text`'s words on the conversation (thread-safe); a sleeping model is woken
        at the next frame to say them."""
        utterance = self.conv.say(text)
        if self.asleep:
            self.request("wake")
        return utterance

    def cancel_say(self) -> None:
        self.conv.cancel_say()

    def _said(self, event: "SayEvent") -> None:
        # its step counted from the conversation's first frame after the persona; the socket's
        # events name themselves in "event", so a word's fate goes in "word_event"
        data = event.to_dict(self.conv.prompt_frames)
        data["word_event"] = data.pop("event")
        self.emit({"event": "say", **data})

    def _heard(self, event: "Heard") -> None:
        # pieces and words as "heard", the user's turn over as "turn_end" (runtime/words/heard.py);
        # what the transcriber made of it goes in "heard"
        data = event.to_dict()
        data["heard"] = data.pop("event")
        self.emit({"event": "turn_end" if event.kind == "turn" else "heard", **data})

    def set_persona(self, persona: Persona, sampling: "SamplingParams | None" = None) -> None:
        """The persona (and sampling) of the next conversation: made at the next sleep, or at
        the next frame when asleep (the one made ready then was the old persona's)."""
        self._next = (persona, sampling)

    @property
    def persona(self) -> Persona:
        return self.conv.persona

    # -- the frame (the loop's worker) ---------------------------------------------------------
    def __call__(self, frame: np.ndarray) -> np.ndarray:
        self.heartbeat = time.monotonic()
        self.frame += 1
        if self.muted:  # the model hears silence and no voice wakes it
            self.stats.muted_frames += 1
            frame = self._silence_in
        return self._listen(frame) if self.asleep else self._talk(frame)

    def _take(self, what: str) -> bool:
        if what in self._requests:
            self._requests.discard(what)
            return True
        return False

    def _talk(self, frame: np.ndarray) -> np.ndarray:
        out = self._step(frame)
        user, model = self.user_vad.speech(frame), self.model_vad.speech(out)
        if user or model or self.conv.saying:
            self._last_speech = self.frame
        if model:
            self._last_model_speech = self.frame
        self._take("wake")  # awake already
        idle = self.frame - self._last_speech
        if self._take("sleep"):
            self._sleep("command")
        elif self.policy.sleep_after_frames and idle >= self.policy.sleep_after_frames:
            self._sleep("idle")
        else:
            speaking = self.frame - self._last_model_speech < SPEAKING_HANG_FRAMES
            self._set_state("speaking" if speaking else "listening")
        return out

    def _step(self, frame: np.ndarray) -> np.ndarray:
        out, token = self.conv.step(frame)
        self.stats.lm_frames += 1
        if token is not None:
            piece = self.text.piece(token)
            if piece:
                self.emit({"event": "text", "text": piece})
        return out

    def _listen(self, frame: np.ndarray) -> np.ndarray:
        self.stats.asleep_frames += 1
        self._preroll.push(frame)
        self._take("sleep")  # asleep already
        if self._next is not None:
            self._new_conversation()
        if self.user_vad.speech(frame):
            self._run += 1
            if self._run == 1:
                self._onset = self.frame
        else:
            self._run = 0
        if self._take("wake"):
            return self._wake("command", None)
        if self._run >= self.policy.wake_frames:
            return self._wake("speech", self.frame - self._onset)
        return self._silence_out

    # -- transitions ------------------------------------------------------------------------------
    def _sleep(self, reason: str) -> None:
        self.asleep = True
        self.stats.sleeps += 1
        self._preroll.clear()
        self._run = 0
        self._set_state("asleep")
        self.emit({"event": "sleep", "reason": reason, "frame": self.frame})
        self._new_conversation()

    def _new_conversation(self) -> None:
        """The next conversation, ready before anyone speaks (module docstring). A persona a
        reload asked for that cannot run (a prompt longer than the context, a recording that
        cannot be read) is refused with an event, and the last one is made again."""
        running = (self.conv.persona, self.conv.sampling)
        (persona, sampling), self._next = self._next or (running[0], None), None
        t0 = time.perf_counter()
        try:
            frames = self._prefill(persona, sampling)
        except PersonaPlexError as e:
            if (persona, sampling) == (running[0], None):
                raise  # the running persona itself: nothing to go back to
            self.emit({"event": "persona_refused", "reason": str(e)})
            persona = running[0]
            frames = self._prefill(*running)
        self.stats.conversations += 1
        self.emit({"event": "conversation", "number": self.stats.conversations,
                   "prompt_frames": frames, "persona_cached": self.conv.persona_cached,
                   "seconds": round(time.perf_counter() - t0, 3),
                   "text_prompt": persona.text_prompt, "voice": persona.voice})

    def _prefill(self, persona: Persona, sampling: "SamplingParams | None") -> int:
        if sampling is not None:
            self.conv.restart(sampling)
        return self.conv.prefill(persona)

    def _wake(self, reason: str, latency: int | None) -> np.ndarray:
        """Steps the LM over the pre-roll (the user's first words), oldest first; the answers
        to all but the newest frame are not played (the model was listening: the speaker
        would fall behind the microphone by as many frames)."""
        self.asleep = False
        self.stats.wakes += 1
        out = self._silence_out
        heard = 0
        for f in self._preroll.frames():
            out = self._step(f)
            heard += 1
        self.stats.preroll_frames += heard
        self._preroll.clear()
        self._last_speech = self.frame
        if latency is not None:
            self.stats.wake_latency_frames.append(latency)
            del self.stats.wake_latency_frames[:-100]
        self.emit({"event": "wake", "reason": reason, "frame": self.frame,
                   "latency_frames": latency, "preroll_frames": heard})
        self._set_state("listening")
        return out

    def _set_state(self, state: str) -> None:
        if state != self.state:
            self.state = state
            self.emit({"event": "state", "state": state})

    def snapshot(self) -> dict:
        return {"state": self.state, "muted": self.muted, "frame": self.frame,
                **self.stats.to_json()}
