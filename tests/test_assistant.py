"""`personaplex-edge assistant`: its config, its unit, and the service itself on a private
PulseAudio as systemd runs it (tests/assistant_service.py): sleep and wake, a sound server that
dies and comes back, SIGHUP, the control socket beside a bad client, the notify protocol."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from personaplex_edge.errors import ConfigError
from personaplex_edge.runtime.assistant.config import load_config

needs_pulse = pytest.mark.skipif(
    shutil.which("pulseaudio") is None or shutil.which("paplay") is None,
    reason="PulseAudio is not installed (apt-get install pulseaudio pulseaudio-utils; "
           "scripts/install.sh does, so CI runs these tests)")


def _cli(*args, env=None, timeout=60, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "personaplex_edge.cli", "assistant", *args],
                          capture_output=True, text=True, timeout=timeout, env=env, cwd=cwd)


# -- the config -----------------------------------------------------------------------------------
def test_the_file_sets_keys_and_flags_override_them(tmp_path):
    path = tmp_path / "a.toml"
    path.write_text('model = "demo"\n[persona]\ntext_prompt = "You sell bread."\nvoice = "NATM1"\n'
                    "[idle]\nsleep_after = 12.5\n[audio]\naec = false\ninput_device = 3\n")
    cfg = load_config(path, {"idle.sleep_after": ("--sleep-after", 4.0)})
    assert cfg["model"] == "demo" and cfg["audio.aec"] is False
    assert cfg["idle.sleep_after"] == 4.0  # the flag over the file
    assert cfg["audio.input_device"] == 3 and cfg["audio.output_device"] is None
    assert cfg.persona.text_prompt == "You sell bread." and cfg.persona.voice == "NATM1"
    assert cfg["idle.preroll_ms"] == 320 and cfg.source == str(path)  # a default kept


def test_no_file_at_the_default_path_means_the_defaults(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    assert load_config().source == "defaults"
    (tmp_path / "personaplex-edge").mkdir()
    (tmp_path / "personaplex-edge" / "assistant.toml").write_text("[idle]\nsleep_after = 7\n")
    assert load_config()["idle.sleep_after"] == 7


@pytest.mark.parametrize("text, named", [
    ("[idle]\nsleep_after = \"soon\"\n", "idle.sleep_after: expected a number"),
    ("[idle]\nsleep_afterr = 3\n", "unknown key 'idle.sleep_afterr'"),
    ("[idle]\nvad_aggressiveness = 5\n", "idle.vad_aggressiveness: expected an integer from 0"),
    ("[idle]\nvad = \"loud\"\n", "idle.vad: expected one of 'webrtc', 'silero'"),
    ("[idle]\nvad_threshold = 1.5\n", "idle.vad_threshold: expected a number from 0 to 1"),
    ("[audio]\naec = \"yes\"\n", "audio.aec: expected true or false"),
    ("model = \n", "not valid TOML"),
    # values that passed a type check and then crashed, spun or took all memory
    ("[idle]\nsleep_after = inf\n", "idle.sleep_after: expected a finite number"),
    ("[idle]\nsleep_after = nan\n", "idle.sleep_after: expected a finite number"),
    ("[audio]\nretry_seconds = nan\n", "audio.retry_seconds: expected a finite number"),
    ("[idle]\npreroll_ms = 100000000\n", "idle.preroll_ms: expected an integer from 0 to 10000"),
    ("[sampling]\ntemp = 0\n", "sampling.temp: expected a number above 0"),
])
def test_a_bad_value_is_one_message_naming_the_key_and_exit_2(tmp_path, text, named):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=named.replace("(", r"\(")):
        load_config(path)
    done = _cli("--config", str(path))
    assert done.returncode == 2 and named in done.stderr, done.stderr
    assert "Traceback" not in done.stderr and str(path) in done.stderr


@pytest.mark.parametrize("value, said", [("-1", "expected a number from 0 to 86400"),
                                         ("inf", "expected a finite number"),
                                         ("nan", "expected a finite number")])
def test_a_bad_flag_is_named_as_the_flag(value, said):
    done = _cli("--sleep-after", value, "--no-socket")
    assert done.returncode == 2 and f"--sleep-after: {said}" in done.stderr, done.stderr


def test_a_socket_in_use_is_refused_before_the_model_loads(tmp_path):
    path = tmp_path / "in-use.sock"
    other = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    other.bind(str(path))
    other.listen(1)
    try:  # the built-in model is exported on its first use: the refusal must come first
        done = _cli("--socket", str(path), "--model", "demo")
    finally:
        other.close()
    assert done.returncode == 2 and "another assistant answers on" in done.stderr, done.stderr
    assert path.exists()  # the other's socket is left alone


@pytest.mark.parametrize("where, said", [("under a file", "is not a directory"),
                                         ("in /proc", "cannot make or enter"),
                                         ("too long", "a Unix socket's path may have")])
def test_a_socket_path_that_cannot_hold_a_socket_is_one_message(tmp_path, where, said):
    (tmp_path / "a-file").write_text("")
    path = {"under a file": tmp_path / "a-file" / "sub" / "assistant.sock",
            "in /proc": Path("/proc/personaplex-edge-none/assistant.sock"),
            "too long": tmp_path / ("x" * 120) / "assistant.sock"}[where]
    done = _cli("--socket", str(path), "--model", "demo")
    assert done.returncode == 2 and said in done.stderr, done.stderr
    assert done.stderr.count("error:") == 1 and "Traceback" not in done.stderr
    assert "--socket" in done.stderr or "control.socket" in done.stderr


def _config_on(model_dir: Path, path: Path, text: str = "") -> Path:
    path.write_text(f'model = {json.dumps(str(model_dir))}\ndevice = "cpu"\nthreads = 1\n'
                    f"{text}")
    return path


@pytest.mark.parametrize("text, said", [
    ("[sampling]\ntop_k = 100000\n", "sampling.top_k 100000 is outside 1.."),
    ("[sampling]\ntop_k_text = 100000\n", "sampling.top_k_text 100000 is outside 1.."),
    ('[persona]\nvoice = "NOPE"\n', "persona.voice: no voice 'NOPE'"),
])
def test_what_the_model_cannot_take_is_named_by_its_key_at_start(demo_model_dir, tmp_path,
                                                                 text, said):
    """Checked against the loaded model before a conversation is opened: the key and its
    file, not a flag the assistant does not have."""
    config = _config_on(demo_model_dir, tmp_path / "a.toml", text)
    done = _cli("--config", str(config), "--no-socket")
    assert done.returncode == 2 and f"{config}: {said}" in done.stderr, done.stderr
    assert "--top-k" not in done.stderr and "Traceback" not in done.stderr


def test_a_missing_silero_model_is_refused_before_the_model_loads(tmp_path):
    """At start and by --install-unit (no unit written): the built-in model would be
    exported on its first use, and it is not."""
    config = tmp_path / "a.toml"
    config.write_text('model = "demo"\n[idle]\nvad = "silero"\n'
                      f'silero_model = {json.dumps(str(tmp_path / "none.onnx"))}\n')
    for extra in ([], ["--install-unit", "--unit-dir", str(tmp_path / "units")]):
        done = _cli("--config", str(config), "--no-socket", *extra)
        assert done.returncode == 2, done.stderr
        assert f"{config}: idle.vad: idle.silero_model: {tmp_path / 'none.onnx'} does not " \
               "exist" in done.stderr
        assert "export" not in done.stdout + done.stderr and "loading" not in done.stdout
    assert not (tmp_path / "units").exists()


def test_a_persona_that_cannot_run_is_refused_at_the_sleep_and_the_last_stays(demo_model):
    """A reload's persona whose prompt is longer than the context: the gate says so in an
    event and makes the running persona's conversation again, instead of raising in the
    audio loop (which ended the service)."""
    from personaplex_edge.runtime.assistant.idle import IdleGate, IdlePolicy
    from personaplex_edge.runtime.persona import Persona

    conv = demo_model.open_conversation(persona=Persona(text_prompt="You sell bread."))
    conv.prefill()
    events: list[dict] = []
    gate = IdleGate(conv, demo_model.text, IdlePolicy(sleep_after_frames=3), events.append)
    gate.set_persona(Persona(text_prompt="word " * (demo_model.context + 10)))
    for _ in range(5):
        gate(np.zeros(1920, np.float32))
    assert gate.asleep
    refused = [e for e in events if e["event"] == "persona_refused"]
    assert len(refused) == 1 and "more than this model's context" in refused[0]["reason"]
    made = [e for e in events if e["event"] == "conversation"]
    assert made[-1]["text_prompt"] == "You sell bread." and conv.persona.text_prompt == \
        "You sell bread."
    gate.request("wake")
    gate(np.zeros(1920, np.float32))  # and the conversation goes on
    assert not gate.asleep
    conv.close()


# -- the unit -------------------------------------------------------------------------------------
@pytest.mark.skipif(shutil.which("systemd-analyze") is None,
                    reason="systemd-analyze is not installed (apt-get install systemd; "
                           "scripts/install.sh does, so CI runs this test)")
def test_the_installed_unit_passes_systemd_analyze_verify(tmp_path):
    config = tmp_path / "my config.toml"
    config.write_text('[idle]\nsleep_after = 30\n')
    done = _cli("--install-unit", "--unit-dir", str(tmp_path / "units"), "--config", str(config),
                "--voice-prompt", "NATM1", "--model", "demo")
    assert done.returncode == 0, done.stderr
    unit = tmp_path / "units" / "personaplex-edge-assistant.service"
    text = unit.read_text()
    assert "Type=notify" in text and "WatchdogSec=" in text and "@EXEC@" not in text
    assert f"--config '{config}'" in text and "--voice-prompt NATM1" in text
    verify = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True,
                            text=True, timeout=60)
    assert verify.returncode == 0, verify.stderr
    # the check judges: the same unit with a command that does not exist is refused
    broken = tmp_path / "broken" / unit.name
    broken.parent.mkdir()
    broken.write_text(text.replace("ExecStart=", "ExecStart=/nonexistent/personaplex-edge "
                                                 "#"))
    refused = subprocess.run(["systemd-analyze", "verify", str(broken)], capture_output=True,
                             text=True, timeout=60)
    assert refused.returncode != 0 and "nonexistent" in refused.stderr


def test_install_unit_writes_absolute_paths_and_no_restart_on_exit_2(demo_model_dir, tmp_path):
    """Relative flags are written absolute (the unit runs elsewhere), the unit runs in the
    directory it was written from (a relative path in the config file means what it meant
    there), and a refused configuration (exit 2) is not restarted every 5 s."""
    import shlex

    here = tmp_path / "here"
    here.mkdir()
    (here / "a.toml").write_text('device = "cpu"\n')
    (here / "me.wav").write_bytes((Path(__file__).parent.parent / "personaplex_edge" / "data"
                                   / "hello.wav").read_bytes())
    model = os.path.relpath(demo_model_dir, here)
    done = _cli("--install-unit", "--unit-dir", "units", "--config", "a.toml", "--model", model,
                "--voice-prompt", "me.wav", "--socket", "run/a.sock", "--text-prompt", "Hi.",
                cwd=here)
    assert done.returncode == 0, done.stderr
    text = (here / "units" / "personaplex-edge-assistant.service").read_text()
    exec_start = shlex.split(next(line for line in text.splitlines()
                                  if line.startswith("ExecStart="))[len("ExecStart="):])
    flags = dict(zip(exec_start[exec_start.index("assistant") + 1::2],
                     exec_start[exec_start.index("assistant") + 2::2]))
    assert flags == {"--config": str(here / "a.toml"),
                     "--model": os.path.abspath(here / model),
                     "--voice-prompt": str(here / "me.wav"), "--socket": str(here / "run/a.sock"),
                     "--text-prompt": "Hi."}
    assert f"WorkingDirectory={here}\n" in text and "RestartPreventExitStatus=2\n" in text


@pytest.fixture
def user_manager(tmp_path):
    import user_manager as um

    why = um.available()
    if why:
        pytest.skip(why)
    from pulse import start_pulse

    (tmp_path / "pulse").mkdir()
    pulse, pulse_env = start_pulse(tmp_path / "pulse", room=True)
    try:
        env = {k: v for k, v in pulse_env.items() if k.startswith("PULSE_")}
        manager = um.UserManager(tmp_path / "systemd", dict(os.environ, **env))
        yield manager
        manager.close()
    finally:
        pulse.terminate()
        pulse.wait(timeout=10)


def test_the_written_unit_starts_under_a_systemd_user_manager(user_manager, demo_model_dir,
                                                             tmp_path):
    """The unit --install-unit writes, started by a real `systemd --user`: READY=1 makes it
    active, its control socket (a relative path in the config file) answers where the config
    meant it; a configuration the model refuses ends it with exit 2, failed, not restarted."""
    here = tmp_path / "here"
    here.mkdir()
    config = here / "assistant.toml"

    def write(extra: str = "") -> None:
        config.write_text(f"model = {json.dumps(os.path.relpath(demo_model_dir, here))}\n"
                          'device = "cpu"\nthreads = 1\n[control]\nsocket = "ctl/a.sock"\n'
                          + extra)

    write()
    env = dict(os.environ, XDG_CONFIG_HOME=str(user_manager.config))
    done = _cli("--install-unit", "--config", "assistant.toml", cwd=here, env=env)
    assert done.returncode == 0, done.stderr
    unit = "personaplex-edge-assistant.service"
    assert (user_manager.unit_dir / unit).is_file()
    user_manager.systemctl("daemon-reload", check=True)
    user_manager.systemctl("start", "--no-block", unit, check=True)
    state = user_manager.wait(unit, lambda s: s["ActiveState"] in ("active", "failed"), 120)
    log = user_manager.systemctl("status", "--no-pager", "-n", "20", unit).stdout
    assert state["ActiveState"] == "active", log
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.connect(str(here / "ctl" / "a.sock"))
        sock.sendall(b'{"cmd": "status"}\n')
        reply = json.loads(sock.makefile("r").readline())
    assert reply["ok"] is True and reply["model_loads"] == 1
    user_manager.systemctl("stop", unit, check=True)

    write("[sampling]\ntop_k = 100000\n")
    user_manager.systemctl("start", "--no-block", unit, check=True)
    state = user_manager.wait(unit, lambda s: s["ActiveState"] == "failed", 120)
    assert state["ExecMainStatus"] == "2" and state["NRestarts"] == "0", state
    # a restart scheduled would show at once as activating (auto-restart, RestartSec's wait)
    # and count in systemd's NRestarts; this sleep only proves nothing comes for a while (a
    # slow machine can miss a restart in it, never invent one)
    time.sleep(1.0)
    assert user_manager.show(unit, "ActiveState", "NRestarts") == {"ActiveState": "failed",
                                                                  "NRestarts": "0"}


# -- the voice detector ---------------------------------------------------------------------------
def _silero_or_skip():
    from personaplex_edge.errors import PersonaPlexError
    from personaplex_edge.runtime.assistant.silero import silero_model_path

    try:
        return silero_model_path()
    except PersonaPlexError as e:  # scripts/install.sh installs it; a bare venv may not
        pytest.skip(str(e))


@pytest.mark.parametrize("engine", ["webrtc", "silero"])
def test_the_voice_detector_hears_speech_and_not_silence_or_hum(engine):
    import personaplex_edge as pe
    from personaplex_edge.runtime.assistant.vad import voice_detector
    from personaplex_edge.runtime.bench import bundled_speech

    if engine == "silero":
        _silero_or_skip()
    speech = pe.read_audio(bundled_speech())
    vad = voice_detector(engine)

    def rate(signal):
        n = signal.shape[0] // 1920
        return np.mean([vad.speech(signal[i * 1920:(i + 1) * 1920]) for i in range(n)])

    t = np.arange(24000 * 3) / 24000
    assert rate(speech) > 0.7
    assert rate(np.zeros(24000 * 3, np.float32)) == 0.0
    hum = (0.3 * np.sin(2 * np.pi * 50 * t)).astype(np.float32)  # mains hum
    rate(hum[:24000])  # its first second: the detector learns the noise floor
    assert rate(hum[24000:]) == 0.0


def test_silero_tells_music_from_speech():
    """webrtcvad calls 92-100 % of music frames a voice (benchmarks/bench_vad.py): silero is
    the option for a room with music in it. Music here: a piano-like melody with a drum."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    from bench_vad import _piano

    import personaplex_edge as pe
    from personaplex_edge.runtime.assistant.vad import voice_detector
    from personaplex_edge.runtime.bench import bundled_speech

    _silero_or_skip()
    music = _piano(8.0, np.random.default_rng(0))
    speech = pe.read_audio(bundled_speech())

    def rate(engine, signal):
        vad = voice_detector(engine)
        n = signal.shape[0] // 1920
        return np.mean([vad.speech(signal[i * 1920:(i + 1) * 1920]) for i in range(n)])

    assert rate("silero", music) < 0.05 and rate("silero", speech) > 0.7
    assert rate("webrtc", music) > 0.5  # what the option is for


def test_the_16_khz_path_of_silero_keeps_speech_band_and_drops_aliases():
    """24 -> 16 kHz frame by frame (its filter's history carried): a tone below 6 kHz comes
    out as the ideal 16 kHz samples of the same tone, delayed by the filter's 47.5 samples at
    48 kHz; a tone above the new Nyquist (8 kHz) is gone, not folded back."""
    from personaplex_edge.runtime.assistant.silero import ThirdsDown

    t = np.arange(24000 * 4) / 24000  # 50 frames
    for f, min_snr in ((300, 60), (1000, 60), (5000, 50)):
        down = ThirdsDown(1920)
        x = (0.5 * np.sin(2 * np.pi * f * t)).astype(np.float32)
        y = np.concatenate([down(x[i * 1920:(i + 1) * 1920]).copy() for i in range(50)])
        m = np.arange(y.size)
        ideal = 0.5 * np.sin(2 * np.pi * f * (m / 16000 - 47.5 / 48000))
        err = y[200:] - ideal[200:]
        assert 10 * np.log10(np.mean(ideal[200:] ** 2) / np.mean(err ** 2)) > min_snr, f
    down = ThirdsDown(1920)
    x = (0.5 * np.sin(2 * np.pi * 10000 * t)).astype(np.float32)
    y = np.concatenate([down(x[i * 1920:(i + 1) * 1920]).copy() for i in range(50)])
    assert np.sqrt(np.mean(y[200:] ** 2)) < 1e-3


def test_a_silero_config_without_its_model_names_the_install(tmp_path):
    from personaplex_edge.errors import PersonaPlexError
    from personaplex_edge.runtime.assistant.vad import voice_detector

    with pytest.raises(PersonaPlexError, match="does not exist"):
        voice_detector("silero", silero_model=str(tmp_path / "none.onnx"))
    with pytest.raises(PersonaPlexError, match="unknown voice detector"):
        voice_detector("loud")


def test_a_gate_on_silero_sleeps_while_music_plays_and_wakes_on_speech(demo_model):
    """idle.vad = "silero" reaches the gate. Music's onset out of silence may wake the model
    (silero scores a sudden attack up to ~0.67), but music playing does not keep it awake: it
    falls asleep again and the rest of the music steps the LM not once. Speech then wakes it
    within two frames of silero first hearing it."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    from bench_vad import _piano

    import personaplex_edge as pe
    from personaplex_edge.runtime.assistant.idle import IdleGate, IdlePolicy
    from personaplex_edge.runtime.bench import bundled_speech

    _silero_or_skip()
    conv = demo_model.open_conversation()
    conv.prefill()
    events = []
    gate = IdleGate(conv, demo_model.text,
                    IdlePolicy(sleep_after_frames=5, preroll_frames=2, vad="silero"),
                    events.append)
    ticks = lambda: conv.group.metrics.frames  # noqa: E731
    for _ in range(30):
        gate(np.zeros(1920, np.float32))
    assert gate.asleep
    music = _piano(16.0, np.random.default_rng(1))
    frames = music.size // 1920
    for i in range(frames // 2):
        gate(music[i * 1920:(i + 1) * 1920])
    assert gate.asleep
    steady = ticks()
    for i in range(frames // 2, frames):  # 8 s more of it
        gate(music[i * 1920:(i + 1) * 1920])
    assert gate.asleep and ticks() == steady
    speech = pe.read_audio(bundled_speech())
    seen = len(events)
    for i in range(40):
        gate(speech[i * 1920:(i + 1) * 1920])
        if not gate.asleep:
            break
    wake = [e for e in events[seen:] if e["event"] == "wake"]
    assert len(wake) == 1 and wake[0]["latency_frames"] <= 2
    assert ticks() == steady + 2  # the pre-roll, at the waking frame
    conv.close()


def test_the_gate_sleeps_steps_nothing_and_wakes_over_its_preroll(demo_model):
    """The service's step on the demo model, frame by frame: asleep after the idle frames, not
    one LM tick while asleep (the model's own count), muted speech ignored, and the waking
    frame steps the four pre-roll frames; a persona set while asleep is made ready at once."""
    import personaplex_edge as pe
    from personaplex_edge.runtime.assistant.idle import IdleGate, IdlePolicy
    from personaplex_edge.runtime.bench import bundled_speech
    from personaplex_edge.runtime.persona import Persona

    speech = pe.read_audio(bundled_speech())
    events = []
    conv = demo_model.open_conversation()
    conv.prefill()
    gate = IdleGate(conv, demo_model.text, IdlePolicy(sleep_after_frames=10, preroll_frames=4),
                    events.append)
    ticks = lambda: conv.group.metrics.frames  # noqa: E731 - the group's, shared: from here
    before = ticks()
    silence = np.zeros(1920, np.float32)
    fed = 0
    while not gate.asleep and fed < 20:
        gate(silence)
        fed += 1
    # 10 frames after the last voice (the demo's first answer has a click the detector hears)
    assert 10 <= fed <= 11 and events[-1]["event"] == "conversation"
    awake_ticks = ticks()
    assert awake_ticks - before == fed
    for _ in range(20):
        assert not gate(silence).any()  # silence played
    gate.muted = True
    for i in range(10):
        gate(speech[i * 1920:(i + 1) * 1920])
    assert gate.asleep and ticks() == awake_ticks  # 30 frames asleep: no step
    gate.muted = False
    gate.set_persona(Persona(text_prompt="You sell bread."))
    gate(silence)
    assert events[-1]["event"] == "conversation"
    assert events[-1]["text_prompt"] == "You sell bread." and ticks() == awake_ticks
    frame = next(i for i in range(40) if gate.user_vad.speech(speech[i * 1920:(i + 1) * 1920]))
    for i in range(frame + 1):
        gate(speech[i * 1920:(i + 1) * 1920])
    wake = [e for e in events if e["event"] == "wake"]
    assert len(wake) == 1 and wake[0]["preroll_frames"] == 4 and wake[0]["latency_frames"] == 0
    assert ticks() == awake_ticks + 4 and not gate.asleep  # the pre-roll, at the waking frame
    assert conv.persona.text_prompt == "You sell bread."
    conv.close()


def test_say_wakes_the_gate_and_keeps_it_awake_until_the_last_word(demo_model):
    """`say` through the gate (the socket's command): a sleeping model is woken at the next
    frame and says every word in order (its text pieces are the words), awake through silence
    longer than its idle time until the last word is done, and asleep again after it."""
    from personaplex_edge.runtime.assistant.idle import IdleGate, IdlePolicy
    from personaplex_edge.runtime.sampling import SamplingParams

    words = "your tea is ready"
    silence = np.zeros(1920, np.float32)
    events = []
    conv = demo_model.open_conversation(SamplingParams(greedy=True))
    conv.prefill()
    gate = IdleGate(conv, demo_model.text, IdlePolicy(sleep_after_frames=3, preroll_frames=2),
                    events.append)
    while not gate.asleep:
        gate(silence)
    assert not gate(silence).any()
    asleep_at, ticks = gate.frame, conv.group.metrics.frames
    utterance = gate.say(words)
    assert utterance.words == ("your", "tea", "is", "ready")
    while not any(e["event"] == "say" and e["word_event"] == "done" and e["last"]
                  for e in events):
        gate(silence)
        assert not gate.asleep, "asleep with words to say"
        assert gate.frame - asleep_at < 100
    said = [e for e in events if e["event"] == "say"]
    assert [e["word"] for e in said if e["word_event"] == "started"] == list(utterance.words)
    wake = [e for e in events if e["event"] == "wake"]
    assert wake[-1]["reason"] == "command" and conv.group.metrics.frames > ticks
    # steps counted from the new conversation's first frame after its persona (the pre-roll's
    # first): the words queued before it, the first word's EPAD goes in after the 2 forced PADs
    started = [e["step"] for e in said if e["word_event"] == "started"]
    done = [e["step"] for e in said if e["word_event"] == "done"]
    assert started[0] == 2 and all(s <= d < n for s, d, n in zip(started, done, started[1:]))
    for _ in range(3):  # the last word's pieces reach the emitted frames a step later
        gate(silence)
    spoken = "".join(e["text"] for e in events[events.index(wake[-1]):] if e["event"] == "text")
    assert " ".join(utterance.words) in " ".join(spoken.split())
    for _ in range(7):  # the words done, the idle clock runs again
        gate(silence)
    assert gate.asleep
    conv.close()


# -- the service ----------------------------------------------------------------------------------
@pytest.fixture
def service(tmp_path, demo_model_dir):
    from assistant_service import AssistantService

    s = AssistantService(tmp_path, demo_model_dir)
    yield s
    s.close()


@needs_pulse
def test_a_reload_the_model_cannot_take_is_refused_and_the_service_goes_on(service):
    """SIGHUP with a top-k past the model's: refused at once (an event, a log line naming the
    key), the running config stays, and the next conversation is made as before - where the
    reload used to be taken and the worker to end the service at the next sleep."""
    c = service.client
    service.write_config(sleep_after=1.5, extra="[sampling]\ntop_k = 100000\n")
    service.proc.send_signal(signal.SIGHUP)
    refused = c.event("reload_refused", timeout=10)[2]
    assert f"{service.config}: sampling.top_k 100000 is outside 1.." in refused["reason"]
    service.notify.wait(lambda m: "READY=1" in m and "RELOADING" not in m, timeout=10,
                        after=len(service.notify.items) - 1)
    mark = len(c.lines.items)
    c.command("wake")
    c.command("sleep")
    c.event("conversation", timeout=20, after=mark)
    assert service.proc.poll() is None and c.command("status")["ok"] is True
    assert "reload refused, the running config stays" in service.log_text()


def _status(notes) -> list[str]:
    return [line[7:] for _, note in notes for line in note.split("\n")
            if line.startswith("STATUS=")]


def _status_once(client, done, timeout: float = 60.0) -> dict:
    """The service's status once done(status) holds, its own counts standing for the time
    that passes; AssertionError (with the last status) after `timeout` s."""
    deadline = time.monotonic() + timeout
    while not done(status := client.command("status")):
        assert time.monotonic() < deadline, f"not within {timeout} s: {status}"
        time.sleep(0.1)
    return status


@needs_pulse
def test_it_sleeps_when_idle_stops_the_model_and_wakes_on_speech(service):
    c = service.client
    sleep_at = c.event("sleep", timeout=20)[0]
    asleep = c.command("status")
    # 15 frames heard asleep, counted by the service, however long a busy machine takes
    still = _status_once(c, lambda s: s["asleep_frames"] >= asleep["asleep_frames"] + 15)
    assert still["state"] == "asleep" and still["asleep_frames"] >= asleep["asleep_frames"] + 15
    assert still["lm_ticks"] == asleep["lm_ticks"]  # the model's own tick count: 0 steps
    service.play()
    i, _, wake = c.event("wake", timeout=15, after=sleep_at)
    assert wake["reason"] == "speech" and wake["latency_frames"] <= 2, wake
    assert wake["preroll_frames"] == 4  # the user's first words went to the model
    # within 2 s of the device's audio (25 frames) of the play, the sound server's own
    # latency included: counted in the service's frames, not on a busy machine's clock
    assert wake["frame"] - still["frame"] < 25, (still["frame"], wake)
    awake = c.command("status")
    assert awake["lm_ticks"] >= still["lm_ticks"] + 4
    # the notify protocol: READY, the states as STATUS, and the watchdog every 0.5 s
    notes = service.notify.items
    statuses = _status(notes)
    assert "asleep" in statuses and "listening" in statuses, statuses
    pings = [t for t, note in notes if note == "WATCHDOG=1"]
    gaps = np.diff(pings)
    assert len(pings) >= 8 and 0.4 <= statistics.median(gaps) <= 0.75, gaps
    assert max(gaps) < 1.0  # systemd's limit is WATCHDOG_USEC (1 s here)


@needs_pulse
def test_a_sound_server_that_dies_is_waited_for_and_the_service_resumes(service):
    c = service.client
    c.event("state", timeout=20)  # running
    before = c.command("status")
    service.kill_sound_server()
    lost = c.event("device_lost", timeout=15)[0]
    service.notify.wait(lambda m: "STATUS=waiting for a device" in m, timeout=5)
    gone = c.command("status")
    # the service waits on: three more watchdog pings of its own (1.5 s of its clock)
    waiting = _status_once(c, lambda s: s["watchdog_pings"] >= gone["watchdog_pings"] + 3)
    # no frames and no steps while the device is away: nothing to answer, no backlog
    assert waiting["frames"] == gone["frames"] and waiting["lm_ticks"] == gone["lm_ticks"]
    assert not waiting["devices_open"] and waiting["status"] == "waiting for a device"
    service.start_sound_server()
    c.event("device_back", timeout=20, after=lost)
    after = _status_once(c, lambda s: s["frames"] > waiting["frames"])  # the figures go on
    assert after["pid"] == before["pid"] and after["device_losses"] == 1
    assert after["frames"] > waiting["frames"] >= before["frames"]  # the figures go on
    assert after["model_loads"] == 1
    log = service.log_text()
    assert "device lost:" in log and "device back after" in log


@needs_pulse
def test_control_socket_sighup_and_sigterm(service, tmp_path):
    c = service.client
    assert os.stat(service.socket_path).st_mode & 0o777 == 0o600  # this user's only
    # a bad client beside the good one: garbage, a non-object, an unknown command
    bad = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    bad.connect(str(service.socket_path))
    bad.sendall(b"{not json\n[1, 2]\n" + json.dumps({"cmd": "dance"}).encode() + b"\n")
    answers = bad.makefile("r")
    errors = [json.loads(answers.readline()) for _ in range(3)]
    assert [e["ok"] for e in errors] == [False] * 3
    assert "not a JSON line" in errors[0]["error"]
    assert "unknown command 'dance'" in errors[2]["error"]
    bad.sendall(b'{"cmd": "status"}\n')  # its session goes on
    assert json.loads(answers.readline())["ok"] is True
    bad.close()
    assert c.command("status")["ok"] is True  # and the good one never noticed
    # mute: speech while asleep does not wake the model; unmuted, it does
    mark = c.event("sleep", timeout=20)[0]
    assert c.command("mute")["muted"] is True
    muted = c.command("status")["muted_frames"]
    service.play()
    # 2.5 s of the speech heard muted (31 frames, counted by the service) wake nothing
    assert _status_once(c, lambda s: s["muted_frames"] >= muted + 31)["state"] == "asleep"
    c.command("unmute")
    service.play()
    c.event("wake", timeout=10, after=mark, reason="speech")
    # SIGHUP: a new persona at the next conversation, the model not loaded again
    service.write_config(sleep_after=1.5, text_prompt="You answer in riddles.")
    service.proc.send_signal(signal.SIGHUP)
    service.notify.wait(lambda m: "RELOADING=1" in m, timeout=10)
    reloaded = c.event("reloaded", timeout=10)[2]
    assert reloaded["next_conversation"] == ["persona.text_prompt"]
    service.wait_played()  # else the rest of the speech may wake it first (reason "speech")
    c.command("sleep")
    new = c.event("conversation", timeout=10, text_prompt="You answer in riddles.")[2]
    assert new["persona_cached"] is False  # a persona the model had never run
    c.command("wake")
    c.event("wake", timeout=10, reason="command")
    status = c.command("status")
    assert status["persona"]["text_prompt"] == "You answer in riddles."
    assert status["model_loads"] == 1 and status["conversations"] >= 3
    # say: the words' events reach the client; a bad say is that client's error line
    assert c.command("say")["ok"] is False
    said = c.command("say", text="the door is open")
    assert said["ok"] is True and said["words"] == ["the", "door", "is", "open"]
    c.event("say", timeout=20, word_event="done", last=True, word="open")
    started = [m["word"] for _, m in c.lines.items if m.get("event") == "say"
               and m.get("word_event") == "started"]
    assert started == ["the", "door", "is", "open"]
    # SIGTERM: STOPPING=1, a summary, exit 0, the socket gone
    service.proc.send_signal(signal.SIGTERM)
    service.notify.wait(lambda m: "STOPPING=1" in m, timeout=10)
    assert service.proc.wait(timeout=30) == 0
    assert "stopped:" in service.log_text() and not service.socket_path.exists()
    assert "Traceback" not in service.log_text()
    assert "\r" not in service.log_text()  # not a terminal: lines for journald, no redraws


def test_the_docs_name_every_config_key_and_command():
    from pathlib import Path

    from personaplex_edge.runtime.assistant.commands import COMMANDS
    from personaplex_edge.runtime.assistant.config import KEYS

    doc = (Path(__file__).resolve().parents[1] / "docs" / "assistant.md").read_text()
    assert [k for k in KEYS if f"| `{k}` |" not in doc] == []
    assert [c for c in COMMANDS if f"| `{c}` |" not in doc] == []
    # and the number of tests it says this file holds
    said = int(re.search(r"`tests/test_assistant.py`, (\d+) tests", doc).group(1))
    collected = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q",
                                "-p", "no:cacheprovider", __file__], capture_output=True,
                               text=True, timeout=120).stdout
    assert f"\n{said} tests collected" in collected, collected[-300:]
