"""A recording played through the live loop in real time, as if a microphone heard it.

The offline `run` steps the session as fast as it can, so it cannot say whether a machine keeps
up with a conversation. This module is a virtual sound card clocked by the host's monotonic
clock: every block of the recording goes into the duplex loop when a microphone would have
delivered it, and a block of output is taken when a speaker would have asked for it. Everything
the live path does happens: frames dropped when the worker falls behind, underruns, the start-up
buffer. No sound hardware is needed (CI machines, headless boards).
"""

from __future__ import annotations

import time
from typing import Callable

import numpy as np

from .duplex import DuplexLoop, FrameStep


def run_paced(step: FrameStep, pcm: np.ndarray, model_rate: int = 24000,
              frame_size: int = 1920, block_seconds: float = 0.02,
              max_backlog_frames: int = 2, buffer_frames: int = 1, tail_seconds: float = 0.0,
              on_tick: Callable[[DuplexLoop], None] | None = None,
              tick_seconds: float = 0.5) -> tuple[np.ndarray, DuplexLoop]:
    """Plays pcm [N] f32 at `model_rate` into the loop in real time, `block_seconds` per
    callback, then `tail_seconds` of silence (so the answer to the end of the recording is
    heard). Returns (what the speaker played [N + tail] f32, the loop with its stats); every
    whole frame heard has been answered or counted as dropped by then (a partly dropped frame
    counts as one, so the two may add up to one or two more than the frames heard)."""
    block = max(1, int(round(block_seconds * model_rate)))
    tail = int(round(tail_seconds * model_rate))
    blocks = -(-(pcm.shape[0] + tail) // block)
    heard = np.zeros(blocks * block, np.float32)  # [blocks * block]
    played = np.zeros(blocks * block, np.float32)  # [blocks * block]
    heard[:pcm.shape[0]] = pcm
    loop = DuplexLoop(step, frame_size=frame_size, model_rate=model_rate,
                      max_backlog_frames=max_backlog_frames, buffer_frames=buffer_frames)
    period = block / model_rate
    loop.start()
    t0 = time.monotonic()
    next_tick = t0 + tick_seconds
    try:
        for k in range(blocks):
            # block k is due at t0 + k * period: after a late wake-up the blocks already due
            # go in at once, as a sound card's buffer delivers what piled up
            delay = t0 + k * period - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            if loop.failed():
                break
            loop.on_input(heard[k * block:(k + 1) * block])
            loop.on_output(played[k * block:(k + 1) * block])
            if on_tick is not None and time.monotonic() >= next_tick:
                on_tick(loop)
                next_tick += tick_seconds
        # the frames still waiting are answered (the speaker is gone: nobody hears them) so
        # that the counts cover the whole recording; a slow model gets as long as it needs,
        # as long as it keeps finishing frames
        done, last_progress = loop.stats.frames, time.monotonic()
        while len(loop.input) >= frame_size and not loop.failed():
            if loop.stats.frames != done:
                done, last_progress = loop.stats.frames, time.monotonic()
            elif time.monotonic() - last_progress > 30.0:
                break  # a step stuck for this long is not going to finish
            time.sleep(0.005)
    except KeyboardInterrupt:
        # a recording has its own end: Ctrl-C aborts (no output), unlike --mic where it is
        # the way to stop; the worker is stopped first so nothing runs on behind the caller
        loop.stats.interrupted = True
        loop.stop()
        raise
    loop.stop()  # re-raises a worker error
    return played[:pcm.shape[0] + tail], loop
