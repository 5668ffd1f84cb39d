"""A private PulseAudio server for tests of the live loop: started in a directory of the test's
own, its null sinks as the speaker and the microphone, stopped by the test."""

from __future__ import annotations

import os
import subprocess
import time

import pytest


def start_pulse(runtime, echo_ms: int | None = None, room: bool = False):
    """A server with a null sink `edge_sink` as the speaker and its monitor as the microphone
    (the model hears itself). With `echo_ms`, the microphone is a second sink's monitor fed
    from the speaker through a loopback of that latency instead: an open speaker, heard back a
    little later. With `room`, the microphone is the monitor of a sink `room` that only the
    test plays into (paplay --device=room): a user in a room, the speaker not heard.
    -> (the server's process, the environment that reaches it)."""
    # no autospawn: a client that lost this server must not start a default one of its own
    # (the tests that kill the server need it to stay gone until they start it again)
    client_conf = os.path.join(str(runtime), "client.conf")
    with open(client_conf, "w") as f:
        f.write("autospawn = no\n")
    env = dict(os.environ, XDG_RUNTIME_DIR=str(runtime), PULSE_RUNTIME_PATH=str(runtime),
               HOME=str(runtime), PULSE_CLIENTCONFIG=client_conf)
    extra = []
    if echo_ms is not None or room:
        extra = ["--load=module-null-sink sink_name=room"]
    if echo_ms is not None:
        extra.append(f"--load=module-loopback source=edge_sink.monitor sink=room "
                     f"latency_msec={echo_ms}")
    server = subprocess.Popen(
        ["pulseaudio", "--daemonize=no", "--exit-idle-time=-1", "--disallow-exit", "-n",
         "--load=module-native-protocol-unix", "--load=module-null-sink sink_name=edge_sink",
         *extra, "--load=module-always-sink", "--log-target=stderr", "--log-level=error"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.time() + 60  # a busy machine's start; a server that dies is seen at once
    while time.time() < deadline:
        if subprocess.run(["pactl", "info"], env=env, capture_output=True).returncode == 0:
            break
        if server.poll() is not None:
            pytest.skip(f"PulseAudio would not start: {server.stderr.read().decode()[-300:]}")
        time.sleep(0.2)
    else:
        server.kill()
        pytest.skip("PulseAudio did not answer within 60 s")
    subprocess.run(["pactl", "set-default-sink", "edge_sink"], env=env, check=True)
    source = "edge_sink.monitor" if not extra else "room.monitor"
    subprocess.run(["pactl", "set-default-source", source], env=env, check=True)
    return server, env
