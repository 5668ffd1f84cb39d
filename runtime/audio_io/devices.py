"""Sound devices through sounddevice (PortAudio): listing them and running a DuplexLoop on them.

The stream runs at 24 kHz when both devices accept it, otherwise at the devices' default rate
(the loop resamples in its worker). Blocks are one frame (80 ms) long.
"""

from __future__ import annotations

import time
import threading
from typing import Callable


from personaplex_edge.errors import AudioDeviceError, PersonaPlexError

from .duplex import DuplexLoop, FrameStep

FRAME_SECONDS = 0.08


def _sd():
    try:
        import sounddevice as sd
    except ImportError:
        raise PersonaPlexError("sound devices need the audio extra: pip install "
                               "'personaplex-edge[audio]'") from None
    except OSError as e:  # the PortAudio library itself is missing
        raise AudioDeviceError(f"PortAudio is not installed ({e}); on Debian/Ubuntu: "
                               "apt-get install libportaudio2") from None
    return sd


def list_devices() -> str:
    sd = _sd()
    devices = sd.query_devices()
    if not len(devices):
        return "no sound devices found"
    default_in, default_out = sd.default.device
    lines = []
    for i, d in enumerate(devices):
        mark = ("<" if i == default_in else " ") + (">" if i == default_out else " ")
        lines.append(f"{mark} {i:3d} {d['name']}  ({d['max_input_channels']} in, "
                     f"{d['max_output_channels']} out, {d['default_samplerate']:.0f} Hz)")
    lines.append("< default input, > default output")
    return "\n".join(lines)


def device_spec(spec: str | int | None) -> str | int | None:
    """A sound device as a user names it (a flag, a config key): an index (an int, or a string
    of digits) as an int, else a part of its name; None for the default."""
    if spec is None or isinstance(spec, int):
        return spec
    return int(spec) if spec.isdigit() else spec


def resolve_device(spec: str | int | None, kind: str) -> int | None:
    """A device index, or a (case-insensitive) part of its name; None for the default."""
    spec = device_spec(spec)
    if spec is None:
        return None
    sd = _sd()
    devices = sd.query_devices()
    key = "max_input_channels" if kind == "input" else "max_output_channels"
    if isinstance(spec, int):
        index = spec
        if not 0 <= index < len(devices):
            raise AudioDeviceError(f"there is no sound device {index}; "
                                   f"'personaplex-edge devices' lists them:\n{list_devices()}")
        if devices[index][key] < 1:
            raise AudioDeviceError(f"device {index} ({devices[index]['name']}) has no {kind}")
        return index
    matches = [i for i, d in enumerate(devices)
               if str(spec).lower() in d["name"].lower() and d[key] > 0]
    if not matches:
        raise AudioDeviceError(f"no {kind} device matches {spec!r}; 'personaplex-edge devices' "
                               f"lists them:\n{list_devices()}")
    return matches[0]


def refresh_devices() -> None:
    """Makes PortAudio list the devices anew (a USB device plugged in, a sound server
    started since): it reads them once, when it starts. Only while no stream is open."""
    sd = _sd()
    sd._terminate()
    sd._initialize()


def _device_rate(sd, device, kind: str, model_rate: int) -> int:
    """The model rate when the device takes it, else the device's default rate."""
    check = sd.check_input_settings if kind == "input" else sd.check_output_settings
    try:
        check(device, channels=1, dtype="float32", samplerate=model_rate)
        return model_rate
    except Exception:
        pass
    try:
        rate = int(sd.query_devices(device, kind)["default_samplerate"])
    except Exception as e:  # PortAudioError: no default device (none at all, or its server gone)
        raise AudioDeviceError(f"there is no {kind} device to open ({e}); 'personaplex-edge "
                               "devices' lists them") from None
    if abs(rate * FRAME_SECONDS - round(rate * FRAME_SECONDS)) > 1e-9:
        raise AudioDeviceError(f"the {kind} device runs at {rate} Hz, which has no whole number "
                               "of samples per 80 ms frame; pick another device")
    return rate


def run_on_devices(step: FrameStep, input_device=None, output_device=None,
                   duration: float | None = None, model_rate: int = 24000,
                   frame_size: int = 1920, on_tick: Callable[[DuplexLoop], None] | None = None,
                   tick_seconds: float = 0.5, max_backlog_frames: int = 2,
                   aec: bool | None = None, step_metrics=None,
                   progress: Callable[[str], None] = print, stop: threading.Event | None = None,
                   on_open: Callable[[DuplexLoop], None] | None = None,
                   startup_seconds: float | None = None) -> DuplexLoop:
    """Runs `step` full duplex until `duration` seconds pass, Ctrl-C or `stop` is set; returns
    the loop (its stats). A device that vanishes ends the run with AudioDeviceError.
    `on_open(loop)` is called once both streams run (the loop's stats then stay the caller's
    to read, however the run ends); `startup_seconds` bounds the wait for a first sample.

    aec: True cancels the speaker's echo from the microphone (echo.py; without libspeexdsp it
    says so once through `progress` and passes the microphone through), False only measures
    the echo, None runs no canceller. `step_metrics`: the step's FrameMetrics, which then
    shows the canceller as its "aec" stage."""
    from .echo import make_canceller

    sd = _sd()
    inp = resolve_device(input_device, "input")
    out = resolve_device(output_device, "output")
    in_rate = _device_rate(sd, inp, "input", model_rate)
    out_rate = _device_rate(sd, out, "output", model_rate)
    echo = (None if aec is None else
            make_canceller(aec, model_rate, frame_size, warn=progress))
    loop = DuplexLoop(step, frame_size=frame_size, model_rate=model_rate, input_rate=in_rate,
                      output_rate=out_rate, max_backlog_frames=max_backlog_frames, echo=echo,
                      step_metrics=step_metrics)
    if startup_seconds is not None:
        loop.startup_seconds = startup_seconds
    try:  # the canceller's native state goes with the run, however it ends
        return _run_streams(loop, sd, inp, out, in_rate, out_rate, duration, on_tick,
                            tick_seconds, stop, on_open)
    finally:
        if echo is not None:
            echo.close()


def _run_streams(loop: DuplexLoop, sd, inp, out, in_rate: int, out_rate: int,
                 duration: float | None, on_tick, tick_seconds: float,
                 stop: threading.Event | None = None, on_open=None) -> DuplexLoop:
    """The two streams around `loop` until `duration` passes or Ctrl-C (run_on_devices)."""
    flags = {"overflow": 0}

    # Two streams rather than one duplex stream: a microphone and a speaker are often separate
    # devices with separate clocks, and the rings between them absorb the difference.
    def on_input(indata, frames, time_info, status):
        if status.input_overflow:
            flags["overflow"] += 1
        loop.on_input(indata[:, 0])

    def on_output(outdata, frames, time_info, status):
        loop.on_output(outdata[:, 0])

    try:
        streams = [
            sd.InputStream(device=inp, samplerate=in_rate, channels=1, dtype="float32",
                           blocksize=int(round(in_rate * FRAME_SECONDS)), callback=on_input),
            sd.OutputStream(device=out, samplerate=out_rate, channels=1, dtype="float32",
                            blocksize=int(round(out_rate * FRAME_SECONDS)), callback=on_output),
        ]
    except Exception as e:  # PortAudioError, ValueError for bad settings
        raise AudioDeviceError(f"cannot open the sound device(s): {e}") from None
    loop.alive = lambda: all(s.active for s in streams)
    loop.device_latency = (float(streams[0].latency), float(streams[1].latency))
    t_end = None if duration is None else time.monotonic() + duration
    interrupted = False
    try:
        with streams[0], streams[1]:
            # the worker (and its stall clock) starts once both streams run: opening a
            # device can take seconds, which must not count as a device that stalled
            loop.start()
            if on_open is not None:
                on_open(loop)
            while (loop.running and (t_end is None or time.monotonic() < t_end)
                   and not (stop is not None and stop.is_set())):
                time.sleep(min(tick_seconds, max(0.0, (t_end or 1e18) - time.monotonic())))
                if on_tick is not None:
                    on_tick(loop)
    except KeyboardInterrupt:
        interrupted = True
    except Exception as e:
        loop.stop()
        raise AudioDeviceError(f"the sound device failed: {e}") from None
    loop.stop()  # re-raises a worker error (device lost, model failure)
    loop.stats.input_overflows = flags["overflow"]
    loop.stats.interrupted = interrupted
    return loop

