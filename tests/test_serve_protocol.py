"""The server's pieces that need no model: message framing, query parameters, the host,
origin and token checks, the drop-oldest backlog, the server's Opus both ways, and the OpenAI Realtime wire
format's PCM and session fields."""

from __future__ import annotations

import json
import os
import socket

import numpy as np
import pytest

pytest.importorskip("aiohttp")

from aiohttp.test_utils import make_mocked_request  # noqa: E402

from personaplex_edge.runtime.persona import Persona  # noqa: E402
from personaplex_edge.runtime.sampling import SamplingParams  # noqa: E402
from personaplex_edge.runtime.serve import protocol  # noqa: E402
from personaplex_edge.errors import PersonaPlexError  # noqa: E402
from personaplex_edge.runtime import pcm_frames as pf  # noqa: E402
from personaplex_edge.runtime.serve import realtime_events as rt  # noqa: E402
from personaplex_edge.runtime.serve.auth import (authorized, origin_allowed,  # noqa: E402
                                                 parse_allowed_origins)
from personaplex_edge.runtime.serve.hosts import (HostRule, host_name,  # noqa: E402
                                                  machine_names, parse_allowed_hosts)
from personaplex_edge.runtime.serve.opus import OpusDecoder, OpusEncoder, OpusError  # noqa: E402
from personaplex_edge.runtime.serve.params import ParamError, Voices, parse_params  # noqa: E402
from personaplex_edge.runtime.frame_backlog import FrameBacklog  # noqa: E402

BANK = Voices(("NATF2", "NATM1"))


def parse(query: dict, voices: Voices = BANK, **defaults):
    return parse_params(query, SamplingParams(**defaults), Persona(), voices, (25, 250))


# -- messages ---------------------------------------------------------------------------------------
def test_server_messages_are_kind_byte_then_payload():
    assert protocol.HANDSHAKE == b"\x00"
    assert protocol.audio(b"OggS..") == b"\x01OggS.."
    assert protocol.text(" héllo") == b"\x02" + " héllo".encode()
    assert protocol.error("busy") == b"\x05busy"
    assert protocol.metadata({"a": 1}) == b'\x04{"a":1}'


@pytest.mark.parametrize("data, reason", [
    (b"", "empty message"),
    (b"\x0aabc", "unknown message kind 10"),
    (b"\xffabc", "unknown message kind 255"),
    (b"\x02hello", r"kind 2 \(text\) is sent by servers"),
    (b"\x05oops", r"kind 5 \(error\) is sent by servers"),
    (b"\x01" + bytes(protocol.MAX_MESSAGE_BYTES), "over the limit"),
])
def test_what_a_client_cannot_send(data, reason):
    with pytest.raises(protocol.ProtocolError, match=reason):
        protocol.parse(data)


def test_client_kinds_the_server_takes():
    assert protocol.parse(b"\x01OggS") == (protocol.Kind.AUDIO, b"OggS")
    for kind in (0x00, 0x03, 0x04, 0x06):  # read and let go
        assert protocol.parse(bytes([kind, 1]))[0] in protocol.IGNORED_FROM_CLIENT
    # exactly at the limit is still a message
    assert protocol.parse(b"\x01" + bytes(protocol.MAX_MESSAGE_BYTES - 1))[0] == protocol.Kind.AUDIO


# -- query parameters -------------------------------------------------------------------------------
def test_missing_parameters_take_the_servers_defaults_and_unknown_ones_are_ignored():
    p = parse({"pad_mult": "0", "repetition_penalty": "1.1", "email": "x", "worker_auth_id": "y"},
              greedy=True, seed=5)
    assert p.sampling == SamplingParams(greedy=True, seed=5)
    assert p.persona == Persona()
    assert p.stats is False


def test_personaplex_parameters_reach_the_conversation():
    p = parse({"text_prompt": "  You like trains. ", "voice_prompt": "NATM1.pt",
               "text_temperature": "0.6", "text_topk": "20", "audio_temperature": "0.9",
               "audio_topk": "100", "text_seed": "7", "audio_seed": "9", "stats": "1"})
    assert p.persona.text_prompt == "You like trains."
    assert p.persona.voice == "NATM1"
    s = p.sampling
    assert (s.temp_text, s.top_k_text, s.temp, s.top_k) == (0.6, 20, 0.9, 100)
    assert s.seed == 7 * 2**32 + 9  # one generator draws both: both seeds make its seed
    assert p.stats is True
    assert parse({"text_seed": "7"}).sampling.seed == 7
    assert parse({"audio_seed": "9"}).sampling.seed == 9
    assert parse({"voice_prompt": "natf2"}).persona.voice == "NATF2"
    assert parse({"text_prompt": ""}).persona.text_prompt is None


@pytest.mark.parametrize("query, name", [
    ({"text_temperature": "hot"}, "text_temperature"),
    ({"text_temperature": "0"}, "text_temperature"),
    ({"audio_temperature": "nan"}, "audio_temperature"),
    ({"audio_temperature": "-1"}, "audio_temperature"),
    ({"text_topk": "2.5"}, "text_topk"),
    ({"text_topk": "26"}, "text_topk"),  # over the model's largest
    ({"audio_topk": "0"}, "audio_topk"),
    ({"text_seed": "-1"}, "text_seed"),
    ({"audio_seed": "x"}, "audio_seed"),
    ({"voice_prompt": "NOPE"}, "voice_prompt"),
    ({"text_prompt": "x" * 5000}, "text_prompt"),
])
def test_a_bad_value_names_its_parameter(query, name):
    with pytest.raises(ParamError, match=f"^query parameter {name}: ") as e:
        parse(query)
    assert e.value.name == name


@pytest.mark.parametrize("value", ["../NATF2", "/etc/passwd", "voices/NATF2.pt", "..\\x.wav",
                                   ".hidden.wav", "a\x00b"])
def test_a_voice_prompt_is_never_a_path(value, tmp_path):
    (tmp_path / ".hidden.wav").write_bytes(b"RIFF")
    with pytest.raises(ParamError, match="not a voice name"):
        parse({"voice_prompt": value}, voices=Voices(BANK.bank, tmp_path))


def test_voice_dir_files_only_inside_it(tmp_path):
    voices = tmp_path / "voices"
    voices.mkdir()
    (voices / "alice.wav").write_bytes(b"RIFF")
    (voices / "notes.txt").write_text("not audio")
    outside = tmp_path / "secret.wav"
    outside.write_bytes(b"RIFF")
    (voices / "escape.wav").symlink_to(outside)
    v = Voices(BANK.bank, voices)
    assert v.names() == ["NATF2", "NATM1", "alice.wav", "escape.wav"]
    assert parse({"voice_prompt": "alice.wav"}, voices=v).persona.voice == str(
        (voices / "alice.wav").resolve())
    assert parse({"voice_prompt": "alice"}, voices=v).persona.voice.endswith("alice.wav")
    for name in ("escape.wav", "notes.txt", "secret.wav"):  # a link out, not audio, not there
        with pytest.raises(ParamError, match="no voice"):
            parse({"voice_prompt": name}, voices=v)
    with pytest.raises(ParamError, match="no voice"):  # no --voice-dir: bank names only
        parse({"voice_prompt": "alice.wav"})


# -- the token ---------------------------------------------------------------------------------------
def test_token_from_query_or_bearer_header():
    def req(path="/api/chat", **headers):
        return make_mocked_request("GET", path, headers=headers)

    assert authorized(req(), None)  # no --auth-token: open
    assert not authorized(req(), "s3cret")
    assert not authorized(req("/api/chat?token=s3cre"), "s3cret")
    assert not authorized(req("/api/chat?token=s3cret2"), "s3cret")
    assert not authorized(req(Authorization="Basic s3cret"), "s3cret")
    assert authorized(req("/api/chat?token=s3cret"), "s3cret")
    assert authorized(req(Authorization="Bearer s3cret"), "s3cret")
    assert authorized(req("/api/chat?token=wrong", Authorization="Bearer s3cret"), "s3cret")
    assert authorized(req("/api/chat?token=%C3%A9t%C3%A9"), "été")


# -- the origin ---------------------------------------------------------------------------------------
def test_an_origin_is_admitted_when_it_is_the_servers_own_or_listed():
    def admitted(allowed=(), **headers):
        request = make_mocked_request("GET", "/v1/realtime",
                                      headers={"Host": "127.0.0.1:8998", **headers})
        return origin_allowed(request, parse_allowed_origins(allowed))

    assert admitted()  # no Origin: a native client
    assert admitted(Origin="http://127.0.0.1:8998")  # the page the server serves
    assert admitted(Origin="https://127.0.0.1:8998")  # behind a TLS proxy: the host decides
    assert not admitted(Origin="http://127.0.0.1:3000")  # another port is another site
    assert not admitted(Origin="http://evil.example")
    assert not admitted(Origin="null")  # a sandboxed frame, a file
    assert admitted(["http://localhost:3000"], Origin="http://LOCALHOST:3000")
    assert not admitted(["http://localhost:3000"], Origin="https://localhost:3000")
    assert admitted(["*"], Origin="http://evil.example")


@pytest.mark.parametrize("value", ["localhost:3000", "ftp://x", "http://x/path", "http://"])
def test_allowed_origins_that_are_not_origins(value):
    with pytest.raises(PersonaPlexError, match="--allowed-origins: .* is not an origin"):
        parse_allowed_origins([value])


# -- the host ---------------------------------------------------------------------------------------
def test_a_host_header_is_compared_by_its_name():
    assert host_name("127.0.0.1:8998") == "127.0.0.1"
    assert host_name("[::1]:8998") == "::1" and host_name("[::1]") == "::1"
    assert host_name("Voice.Example.COM.:443") == "voice.example.com"
    assert host_name("fe80::1") == "fe80::1"  # a bare v6 address keeps its colons


def test_a_loopback_server_answers_to_loopback_names_only():
    rule = HostRule.for_server("127.0.0.1")
    for host in ("localhost:8998", "LOCALHOST", "127.0.0.1:8998", "127.0.0.2", "[::1]:8998",
                 "app.localhost:8998", None, ""):
        assert rule.admits(host), host
    # DNS rebinding: the attacker's name, re-pointed at 127.0.0.1, is still the attacker's
    for host in ("evil.example:8998", "localhost.evil.example", "192.168.1.20:8998",
                 "127.0.0.1.nip.io"):
        assert not rule.admits(host), host
    if "localhost" not in socket.gethostname():  # the machine's name: only beyond loopback
        assert not rule.admits(socket.gethostname())


def test_a_server_bound_beyond_loopback_answers_to_the_machines_names_and_addresses():
    """The machine's names as the system gives them (uname's node name, the resolver's fully
    qualified name), each also as NAME.local, in any case and with a trailing dot; any
    address; nothing else."""
    rule = HostRule.for_server("0.0.0.0")
    node, fqdn = os.uname().nodename, socket.getfqdn()
    own = {node, fqdn, node.split(".")[0] + ".local", fqdn.split(".")[0] + ".local"}
    assert {n.lower() for n in own} <= machine_names()
    for host in [f"{n.upper()}.:8998" for n in own] + ["192.168.1.20:8998", "[fd00::7]:8998",
                                                      "localhost"]:
        assert rule.admits(host), host
    for host in ("evil.example:8998", f"{node}.evil.example", f"evil-{node}.local"):
        assert not rule.admits(host), host
    named = HostRule.for_server("voice.lan")  # the --host name itself
    assert named.admits("voice.lan:8998") and not named.admits("evil.example")


def test_allowed_hosts_add_names_or_admit_any():
    rule = HostRule.for_server("127.0.0.1", parse_allowed_hosts(["Voice.Example.com", ""]))
    assert rule.admits("voice.example.com") and rule.admits("localhost")
    assert not rule.admits("other.example.com")
    assert HostRule.for_server("127.0.0.1", parse_allowed_hosts(["*"])).admits("evil.example")


@pytest.mark.parametrize("value", ["http://voice.example.com", "voice.example.com:443",
                                   "voice.example.com/x", "*.example.com"])
def test_allowed_hosts_that_are_not_names(value):
    with pytest.raises(PersonaPlexError, match="--allowed-hosts: .* is not a host name"):
        parse_allowed_hosts([value])


# -- the backlog ----------------------------------------------------------------------------------
def test_backlog_drops_the_oldest_beyond_its_bound_and_counts_them():
    woken = []
    b = FrameBacklog(max_backlog=2, on_ready=lambda: woken.append(1))
    frames = [np.full(4, i, np.float32) for i in range(6)]
    dropped = [b.push(f) for f in frames]
    assert dropped == [0, 0, 0, 1, 1, 1]
    assert b.dropped == 3 and b.pushed == 6 and len(woken) == 6
    kept = [b.take()[0][0] for _ in range(3)]
    assert kept == [3.0, 4.0, 5.0]  # the newest survive, in order
    assert b.take() is None
    for f in frames[:3]:
        b.push(f)
    assert b.trim(1) == 2 and b.dropped == 5 and b.take()[0][0] == 2.0  # the newest is kept


# -- Opus -------------------------------------------------------------------------------------------
def test_opus_both_ways_in_whole_frames():
    t = np.arange(24000 * 2) / 24000
    pcm = (0.3 * np.sin(2 * np.pi * 330 * t)).astype(np.float32)
    enc, dec = OpusEncoder(24000), OpusDecoder(24000, 1920)
    frames = []
    first = None
    for i in range(0, pcm.shape[0], 1000):  # blocks that are not frames
        pages = enc.encode(pcm[i:i + 1000])
        if pages and first is None:
            first = pages
        if pages:
            frames += dec.feed(pages)
    assert first.startswith(b"OggS") and b"OpusHead" in first
    assert frames and all(f.shape == (1920,) and f.dtype == np.float32 for f in frames)
    out = np.concatenate(frames)
    # the decoded tone has the input's energy (Opus is lossy, and delays by its pre-skip)
    assert 0.5 < np.sqrt(np.mean(out[4000:] ** 2)) / np.sqrt(np.mean(pcm ** 2)) < 1.5


@pytest.mark.parametrize("data", [b"garbage!" * 20, b"OggS" + bytes(100),
                                  b"RIFF" + bytes(200)])
def test_bytes_that_are_not_ogg_opus(data):
    with pytest.raises(OpusError, match="not an Ogg/Opus stream"):
        OpusDecoder().feed(data)


# -- OpenAI Realtime: PCM and the session's fields ----------------------------------------------
def test_pcm_in_appends_of_any_size_makes_the_same_frames():
    """PCM16 cut anywhere - mid-sample, mid-frame - gives the frames of the whole, as float32
    int/32768 (a PCM16 wav's samples as soundfile reads them)."""
    rng = np.random.default_rng(0)
    samples = rng.integers(-32768, 32768, 1920 * 3 + 500).astype("<i2")
    data = samples.tobytes()
    whole = pf.PcmFrames(1920).feed(data, pf.PCM16)[0]
    cut, frames = pf.PcmFrames(1920), []
    for a, b in zip([0, 1, 1001, 3841, 7000], [1, 1001, 3841, 7000, len(data)]):
        frames += cut.feed(data[a:b], pf.PCM16)[0]
    assert len(whole) == len(frames) == 3
    for w, f in zip(whole, frames):
        np.testing.assert_array_equal(w, f)
    np.testing.assert_array_equal(np.concatenate(frames), samples[:5760] / np.float32(32768))
    last = cut.flush()  # stdio's EOF: the 500 samples left, padded with silence
    np.testing.assert_array_equal(last[:500], samples[5760:] / np.float32(32768))
    assert last.shape == (1920,) and not last[500:].any() and cut.flush() is None
    f32 = rng.uniform(-1, 1, 1920).astype("<f4")
    got, n = pf.PcmFrames(1920).feed(f32.tobytes(), pf.F32)
    assert n == 1920 and np.array_equal(got[0], f32)


def test_answers_are_the_pcm16_libsndfile_writes(tmp_path):
    """The PCM16 every front end sends (and write_audio writes) is libsndfile's own conversion
    of the floats: a wav written by soundfile from the same floats holds the same samples."""
    import soundfile as sf

    from personaplex_edge.audio import pcm16_bytes

    pcm = np.random.default_rng(1).uniform(-1.2, 1.2, 4000).astype(np.float32)
    pcm[:4] = [0.5 / 32767, -0.5 / 32767, 1.0, -1.0]  # the rounding and the ends
    sf.write(tmp_path / "by_libsndfile.wav", np.clip(pcm, -1.0, 1.0), 24000, subtype="PCM_16")
    written = sf.read(str(tmp_path / "by_libsndfile.wav"), dtype="int16")[0]
    np.testing.assert_array_equal(np.frombuffer(pcm16_bytes(pcm), "<i2"), written)


def test_session_update_in_either_vocabulary():
    ga = rt.parse_session_update({"type": "session.update", "session": {
        "type": "realtime", "instructions": "Be kind.", "tools": [], "audio": {
            "input": {"format": {"type": "audio/pcm", "rate": 24000}, "turn_detection": None},
            "output": {"voice": {"id": "NATM1"}, "format": {"type": "audio/pcm"}}}}})
    assert ga == rt.SessionUpdate("Be kind.", "NATM1", pf.PCM16)
    flat = rt.parse_session_update({"type": "session.update", "session": {
        "voice": "NATF0.pt", "input_audio_format": "pcm_f32le", "temperature": 0.8}})
    assert flat == rt.SessionUpdate(None, "NATF0.pt", pf.F32, voice_param="session.voice")
    assert rt.parse_session_update({"session": {}}) == rt.SessionUpdate()
    for session, param in [({"audio": {"input": {"format": {"type": "audio/pcm",
                                                           "rate": 16000}}}},
                            "session.audio.input.format"),
                           ({"output_audio_format": "g711_alaw"}, "session.output_audio_format"),
                           ({"audio": {"output": {"format": {"type": "pcm_f32le"}}}},
                            "session.audio.output.format"),
                           ({"instructions": 5}, "session.instructions"),
                           ({"voice": ["NATF2"]}, "session.voice")]:
        with pytest.raises(rt.EventError) as e:
            rt.parse_session_update({"type": "session.update", "session": session,
                                     "event_id": "e1"})
        assert e.value.param == param and e.value.event_id == "e1"


def test_the_beta_vocabulary_is_asked_for_by_its_header():
    assert rt.beta_requested("realtime=v1")
    assert rt.beta_requested("assistants=v2, Realtime=v1")
    assert not rt.beta_requested(None) and not rt.beta_requested("realtime=v2")


def test_response_done_counts_what_the_response_heard_and_said_in_both_vocabularies():
    """usage is the response's own figures - 8 Mimi codes a frame heard, 8 spoken (100 audio
    tokens a second each way), one text token a piece sent - valid for the SDK's
    response.done of either vocabulary."""
    ga = pytest.importorskip("openai.types.realtime")
    beta_types = pytest.importorskip("openai.types.beta.realtime")
    r = rt.Response(transcript=[" Hello", ",", " there"], frames=25)  # 2 s of answer
    for beta, event_type in ((False, ga.ResponseDoneEvent),
                             (True, beta_types.ResponseDoneEvent)):
        done = event_type.model_validate(json.loads(
            rt.ServerEvents(beta=beta).response_closed(r, "completed", None)[-1]))
        usage = done.response.usage
        assert usage.input_tokens == usage.input_token_details.audio_tokens == 200
        assert usage.output_token_details.audio_tokens == 200
        assert usage.output_token_details.text_tokens == 3 and usage.output_tokens == 203
        assert usage.total_tokens == 403 and usage.input_token_details.text_tokens == 0
    assert rt.Response().usage()["total_tokens"] == 0  # a response cancelled at once
