"""WebRTC calls to `serve` on its defaults (127.0.0.1) from clients that know nothing of this
project, each a process of its own written as its users write it (tests/webrtc_clients/): a
Python app on aiortc with aiortc's defaults, a Node app on libwebrtc's bindings
(@roamhq/wrtc), and an app of OpenAI's first (beta) WebRTC flow - its backend on the openai
SDK's beta client, its page on aiortc. Each holds a conversation: the model hears it (the
server's summary of the call) and it hears the model (its own decoder's audio, the events).

They run in a network namespace of their own (own_network.py) with a loopback and one
interface with an address, as a machine has: aiortc gathers only that interface's address, and
the server on loopback must still reach it - and the interface's counter says nothing went out
through it: the call never left the machine.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("aiortc", reason="the webrtc extra (scripts/install.sh installs it)")

from own_network import NIC_ADDRESS, can_isolate, in_own_network  # noqa: E402

SCENE = Path(__file__).parent / "webrtc_clients" / "scene.py"
SECONDS = 3.0


def _scene(model_dir: Path, tmp_path: Path, client: str) -> dict:
    out = tmp_path / client
    done = subprocess.run(in_own_network([sys.executable, str(SCENE), str(model_dir), str(out),
                                          client, str(SECONDS)], nic=True),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads((out / "result.json").read_text())
    assert result["returncode"] == 0, result["stderr"]
    return result


def _candidates(sdp: str) -> list[str]:
    return [line.split()[4] for line in sdp.splitlines() if line.startswith("a=candidate:")]


def _conversed(r: dict, transcript_delta: str) -> dict:
    """The call connected, the model heard the client for the call's length and the client
    heard the model (audio and transcript), nothing went out through the interface, and the
    hang-up freed the slot."""
    c = r["client"]
    assert c["status"] == 201, c
    assert c["connected_s"] is not None and c["state"] == "connected", (c, r["stderr"])
    # its decoder's audio: the answer for about the time it talked (48 kHz)
    assert c["heard"]["samples"] >= 0.8 * SECONDS * 48000 and c["heard"]["energy"] > 0
    kinds = [e["type"] for e in c["events"]]
    assert kinds[0] == "session.created" and "error" not in kinds, kinds
    assert transcript_delta in kinds
    summary = r["summary"]
    assert summary["protocol"] == "webrtc" and summary["frames"] >= 0.8 * SECONDS / 0.08
    assert summary["lost"] == 0
    assert r["slots_used"] == 0
    if can_isolate():
        assert r["sent_out"] == 0  # not one packet left through the interface
    return c


def test_a_stock_aiortc_client_on_this_machine_converses(demo_model_dir, tmp_path):
    """aiortc with its defaults gathers no loopback candidate, only the machine's interface
    addresses; the server on loopback takes them (they are its own machine's) and the call
    connects - it used to end 'did not connect within 5 s'."""
    from openai.types.realtime import RealtimeServerEvent
    from pydantic import TypeAdapter

    r = _scene(demo_model_dir, tmp_path, "aiortc")
    offered = _candidates(r["client"]["offer"])
    assert offered and "127.0.0.1" not in offered
    if can_isolate():
        assert set(offered) == {NIC_ADDRESS.split("/")[0]}
    c = _conversed(r, "response.output_audio_transcript.delta")
    adapter = TypeAdapter(RealtimeServerEvent)
    for event in c["events"]:
        adapter.validate_python(event)
    assert set(_candidates(c["answer"])) == {"127.0.0.1"}  # still nothing but loopback opened


def test_nodes_libwebrtc_on_this_machine_converses(demo_model_dir, tmp_path):
    """libwebrtc's own stack (Node's @roamhq/wrtc), the quick-start's steps in Node."""
    from webrtc_clients.scene import WRTC

    if not WRTC.is_dir():
        pytest.skip(f"@roamhq/wrtc is not installed ({WRTC}): scripts/install.sh installs it "
                    "where npm is")
    _conversed(_scene(demo_model_dir, tmp_path, "node"), "response.output_audio_transcript.delta")


def test_an_app_of_the_beta_webrtc_flow_converses(demo_model_dir, tmp_path):
    """POST /v1/realtime/sessions from the SDK's beta client (the session the SDK's own type
    reads, its client_secret an ek_ key), the page's offer POSTed to /v1/realtime?model=... with
    it: the call's events are the beta's (the SDK's beta types take every one), its persona
    the session's, then the beta session.update the page sends as the channel opens."""
    from openai.types.beta.realtime import RealtimeServerEvent, SessionCreateResponse
    from pydantic import TypeAdapter

    r = _scene(demo_model_dir, tmp_path, "beta")
    c = _conversed(r, "response.audio_transcript.delta")
    session = SessionCreateResponse.model_validate(c["session"])
    assert session.client_secret.value.startswith("ek_") and session.voice == "NATM1"
    assert session.instructions == "You enjoy having a good conversation."
    adapter = TypeAdapter(RealtimeServerEvent)
    for event in c["events"]:
        if event["type"].startswith("session."):  # the beta's types list OpenAI's models only
            event = {**event, "session": {**event["session"], "model": "gpt-realtime"}}
        adapter.validate_python(event)
    kinds = [e["type"] for e in c["events"]]
    assert not [k for k in kinds if k.startswith("response.output_audio")]  # no GA names
    created = c["events"][0]["session"]
    assert created["voice"] == "NATM1" and "audio" not in created  # the beta's flat fields
    updated = c["events"][kinds.index("session.updated")]["session"]
    assert updated["instructions"] == "Be brief." and updated["voice"] == "NATM1"
    assert "conversation.item.created" in kinds and "output_audio_buffer.started" in kinds
