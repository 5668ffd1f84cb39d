"""One conversation over the four graphs: `step(pcm_frame) -> (pcm_frame, text_token)`.

Per 80 ms frame (Moshi's own schedule, see personaplex_edge.streams.TokenRing):

    encode      Mimi encoder: the user's 1920 samples -> 8 codes, written to the token ring
    temporal    Helium step on the complete column -> text token, hidden, new K/V rows
                (written in place into the KV rings at slot position % context)
    depformer   hidden + text token -> the agent's 8 codes
    decode      Mimi decoder: the newest complete agent frame -> 1920 samples

The model (graphs, weights) is read-only; the session owns every buffer that changes: Mimi
state, KV rings, the token ring, sampling noise. All are allocated once; per frame only tokens
and samples cross between host and graphs. The first frame answers silence: the agent's first
audio frame is complete one step later.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from personaplex_edge.errors import PersonaPlexError
from personaplex_edge.manifest import Manifest, load_model_dir
from personaplex_edge.streams import (AGENT_FIRST, SILENCE_TOKENS, TEXT_PAD, TEXT_STREAM,
                                      USER_FIRST, TokenRing)

from .codec import Codec
from .metrics import FrameMetrics
from .prompts import SILENCE_FRAMES, Prefill, build_prefill, forced_frame, wrap_text_prompt
from .backends import open_graph


@dataclass(frozen=True)
class SamplingParams:
    """The reference's defaults. Runtime inputs of the graphs: no re-export to change them."""

    temp: float = 0.8  # audio
    temp_text: float = 0.7
    top_k: int = 250  # audio
    top_k_text: int = 25
    greedy: bool = False
    seed: int | None = None

    def check(self, k_max_text: int, k_max_audio: int) -> None:
        for name, k, k_max in (("top-k-text", self.top_k_text, k_max_text),
                               ("top-k", self.top_k, k_max_audio)):
            if not 1 <= k <= k_max:
                raise PersonaPlexError(f"--{name} {k} is outside 1..{k_max} (the largest top-k "
                                       "this model was exported with)")
        for name, t in (("temp-text", self.temp_text), ("temp", self.temp)):
            if not t > 0:
                raise PersonaPlexError(f"--{name} must be above 0 (use --greedy for argmax)")


class _Gumbel:
    """Fills a bound noise buffer with Gumbel samples in place (no allocation per frame)."""

    def __init__(self, target: np.ndarray, rng: np.random.Generator):
        self.target = target
        self.rng = rng
        self._u = np.empty(target.shape, np.float64)

    def fill(self) -> None:
        u = self._u
        self.rng.random(out=u)
        np.clip(u, np.finfo(np.float64).tiny, 1.0 - np.finfo(np.float64).epsneg, out=u)
        np.log(u, out=u)
        np.negative(u, out=u)
        np.log(u, out=u)
        np.negative(u, out=u)
        np.copyto(self.target, u, casting="same_kind")


class Session:
    def __init__(self, model_dir: str | Path, manifest: Manifest,
                 sampling: SamplingParams = SamplingParams(), device: str = "auto",
                 threads: int | None = None):
        self.model_dir = Path(model_dir)
        self.manifest = manifest
        self.config = manifest.config
        self.codec = Codec(model_dir, manifest, device, threads)
        self.helium = open_graph(model_dir, manifest, "helium_step", device, threads)
        self.depformer = open_graph(model_dir, manifest, "depformer_step", device, threads)
        self.frame_size = self.codec.frame_size
        self.ring = TokenRing(self.config)
        self.metrics = FrameMetrics()
        self._h = self.helium.inputs
        self._d = self.depformer.inputs
        self._silence = np.zeros((1, 1, self.frame_size), np.float32)
        self.sampling = sampling
        self.set_sampling(sampling)
        self.last_frame: np.ndarray | None = None
        self._extra_set = True  # the bound buffer's content is not known to be zeros yet
        self._closed = False

    @classmethod
    def load(cls, model_dir: str | Path, sampling: SamplingParams = SamplingParams(),
             device: str = "auto", threads: int | None = None,
             progress: Callable[[str], None] | None = None) -> "Session":
        manifest = load_model_dir(model_dir, need="lm", progress=progress)
        return cls(model_dir, manifest, sampling, device, threads)

    def close(self) -> None:
        """Releases the graphs' device memory now (a GPU backend; dropping the session does the
        same, later). The session refuses to run after this."""
        self._closed = True
        self.codec.close()
        self.helium.close()
        self.depformer.close()

    def _check_open(self) -> None:
        if self._closed:
            raise PersonaPlexError("this session was closed; load the model again")

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- settings ---------------------------------------------------------------------------
    def set_sampling(self, sampling: SamplingParams) -> None:
        sampling.check(self._h["text_noise"].shape[-1], self._d["audio_noise"].shape[-1])
        self.sampling = sampling
        self._h["text_temperature"][...] = sampling.temp_text
        self._h["text_top_k"][...] = sampling.top_k_text
        self._d["audio_temperature"][...] = sampling.temp
        self._d["audio_top_k"][...] = sampling.top_k
        rng = np.random.default_rng(sampling.seed)
        self._noise = [] if sampling.greedy else [_Gumbel(self._h["text_noise"], rng),
                                                  _Gumbel(self._d["audio_noise"], rng)]
        if sampling.greedy:
            self._h["text_noise"][...] = 0.0  # zero noise: argmax
            self._d["audio_noise"][...] = 0.0

    def reset(self) -> None:
        """A new conversation on the same model: state back to its initial values (the KV rings
        need no clearing: slots are masked by position), the seed's noise stream restarts."""
        self.codec.reset()
        self.helium.reset()
        self.depformer.reset()
        self.ring.reset()
        self.set_sampling(self.sampling)

    @property
    def position(self) -> int:
        return self.ring.position

    @property
    def context(self) -> int:
        return self.config.temporal_config.max_position_embeddings

    # -- persona ----------------------------------------------------------------------------
    def prompt_frames(self, text_prompt: str | None, voice_codes: np.ndarray | None = None,
                      ) -> list[np.ndarray]:
        """The forced frames of the persona, in the reference's order (see runtime/prompts)."""
        frames = [forced_frame(TEXT_PAD, codes) for codes in
                  (voice_codes if voice_codes is not None else [])]
        silence = [forced_frame(TEXT_PAD, SILENCE_TOKENS)] * SILENCE_FRAMES
        frames += silence
        if text_prompt:
            from .text import TextTokenizer

            tokens = TextTokenizer(self.model_dir, self.manifest).encode(
                wrap_text_prompt(text_prompt))
            frames += [forced_frame(t, SILENCE_TOKENS) for t in tokens]
        return frames + silence

    def encode_voice(self, pcm: np.ndarray) -> np.ndarray:
        """A voice prompt from audio (24 kHz mono, loudness-normalised by the caller) -> the
        agent codes of each frame [V, 8]. The codec is reset before and after."""
        self.codec.reset()
        codes = self.codec.encode(pcm)
        self.codec.reset()
        return codes

    def prefill(self, text_prompt: str | None = None, voice_codes: np.ndarray | None = None,
                voice_embeddings: np.ndarray | None = None,
                voice_cache: np.ndarray | None = None) -> int:
        """Runs the persona prompts (teacher-forced, nothing sampled but the first live text and
        codebook 0) from a fresh conversation; returns the number of prompt frames. Prompts
        are only read by the temporal transformer, which fills the KV ring."""
        self._check_open()
        self.reset()
        frames = self.prompt_frames(text_prompt, voice_codes)
        plan = build_prefill(self.ring.initial, frames, voice_embeddings, voice_cache)
        if len(plan) + 1 > self.context:
            raise PersonaPlexError(
                f"the persona prompts take {len(plan)} frames, more than this model's context of "
                f"{self.context} frames ({self.context / 12.5:.0f} s); shorten the text or voice "
                "prompt")
        self._run_prefill(plan)
        return len(plan)

    def _run_prefill(self, plan: Prefill) -> None:
        last = len(plan) - 1
        for position in range(last):
            self.ring.offset = position  # the position the temporal step runs at
            self._temporal(plan.columns[position][None], plan.embeddings[position])
        # The last prompt column runs like a live step: its text and agent codebook 0 are the
        # first sampled tokens; agent codebooks 1..7 of that column stay the forced ones.
        ring, slots = self.ring, self.ring.slots
        ring.offset = last
        ring.tokens[:, :, last % slots] = plan.columns[last]
        ring.tokens[:, :, (last + 1) % slots] = plan.pending
        for noise in self._noise:
            noise.fill()
        self._temporal(ring.step_input(), plan.embeddings[last])
        agent = self._depformer().copy()  # [1, 8]
        agent[:, 1:] = plan.pending[AGENT_FIRST + 1:USER_FIRST]
        ring.write_generated(self.helium.outputs["text_token"], agent)

    # -- the frame --------------------------------------------------------------------------
    def _temporal(self, tokens: np.ndarray, extra: np.ndarray | None) -> None:
        h = self._h
        np.copyto(h["tokens"], tokens)
        if extra is not None:
            np.copyto(h["extra_embedding"], extra.reshape(h["extra_embedding"].shape))
            self._extra_set = True
        elif self._extra_set:  # zeroed once after a voice prompt, not rewritten every frame
            h["extra_embedding"][...] = 0.0
            self._extra_set = False
        h["position"][...] = self.ring.position
        self.helium.run()  # also writes the step's K/V rows into the rings

    def _depformer(self) -> np.ndarray:
        """The agent's 8 codes [1, 8] from the temporal step just run (a view)."""
        np.copyto(self._d["hidden"], self.helium.outputs["hidden"])
        np.copyto(self._d["text_token"], self.helium.outputs["text_token"])
        return self.depformer.run()["audio_tokens"]

    def step_tokens(self, user_codes: np.ndarray) -> np.ndarray | None:
        """One temporal step from the user's codes [8]; the model samples text and agent codes.
        Returns the newest complete agent frame [9] (text, cb0..7) or None while the first
        frame is still incomplete."""
        self._check_open()
        m = self.metrics
        for noise in self._noise:
            noise.fill()
        self.ring.write_user(user_codes)
        tokens = self.ring.step_input()
        m.mark("host")
        self._temporal(tokens, None)
        m.mark("temporal")
        agent = self._depformer()
        m.mark("depformer")
        self.ring.write_generated(self.helium.outputs["text_token"], agent)
        out = self.ring.output()
        self.last_frame = None if out is None else out[0]  # [9]: text, agent cb0..7
        return self.last_frame

    def step(self, pcm: np.ndarray) -> tuple[np.ndarray, int | None]:
        """pcm [1920] f32 at 24 kHz -> (pcm [1920] f32, the text token of the emitted frame, or
        None before the first complete frame). The returned pcm is a view into a buffer the next
        call overwrites."""
        self._check_open()
        m = self.metrics
        m.start_frame()
        codes = self.codec.encode_frame(pcm)[0]
        m.mark("encode")
        out = self.step_tokens(codes)
        if out is None:
            m.end_frame()
            return self._silence[0, 0], None
        audio = self.codec.decode_frame(out[1:])
        m.mark("decode")
        m.end_frame()
        return audio[0, 0], int(out[TEXT_STREAM])
