"""One WebRTC call: the OpenAI Realtime session of realtime.py, its events on the `oai-events`
data channel and its audio on an Opus track (media.py), on the session flow every other
route runs (lifecycle.converse).

    the offer checked (offer.py), a slot taken  ->  the peer connection: the offer's
    reachable candidates, the audio section answered with Opus and the answer track, every
    other media section inactive, host candidates on the server's own addresses (ice.py)  ->
    the answer (routes.py sends it: 201)  ->  ICE + DTLS within CONNECT_TIMEOUT_S, or the call
    ends ("ice")  ->  the data channel `oai-events` opens (or there is none: the call converses
    without events)  ->  the persona: the call's starting session (the form's, the client key's)
    and the session.update sent within GRACE_S of the channel opening  ->  prefill, ticks:
    RTP in through the jitter buffer, answers out on the track, every event but the audio
    deltas on the channel  ->  the end: a hang-up (the peer closes, or DELETE on the call), no
    audio for PEER_GONE_S ("peer_gone"), a failed connection, the server stopping  ->  the
    response's last events on the channel, the peer connection closed (its UDP ports with it),
    the slot freed.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import AsyncIterator

import numpy as np
from aiohttp import WSCloseCode, web
from aiortc import RTCPeerConnection, RTCRtpSender, RTCSessionDescription
from aiortc.sdp import SessionDescription

from ..lifecycle import Transport, converse, free_slot, open_session
from ..realtime import RealtimeSession, RealtimeWire
from ..realtime_events import EventError, ServerEvents, new_id, parse_session_update
from ..session import ClientError
from ..state import ServerState
from .channel import MAX_MESSAGE_BYTES, cap_messages
from .ice import gathering_on, reachable_candidates
from .media import AnswerTrack, RtpIn, tap_rtp
from .offer import Offer, OfferError

log = logging.getLogger("personaplex_edge.serve")

CHANNEL = "oai-events"  # the data channel OpenAI's clients open for the events
CONNECT_TIMEOUT_S = 5.0  # answer -> connected (ICE and DTLS), or the call ends
CHANNEL_WAIT_S = 2.0  # connected -> the events channel open, or the call goes on without
PEER_GONE_S = 3.0  # no RTP for this long: the peer is gone
CLOSE_TIMEOUT_S = 2.0
STATS_INTERVAL_S = 1.0
# bytes of the client's events waiting to be read (four messages of the largest the answer
# allows: channel.py)
MAX_INBOX_BYTES = 4 * MAX_MESSAGE_BYTES
MAX_BUFFERED_BYTES = 1 << 20  # events queued on a channel its peer does not read


class CallSession(RealtimeSession):
    """A Realtime session whose audio is the call's RTP track, both ways."""

    protocol = "webrtc"

    def __init__(self, events, owner: "Call", **core):
        super().__init__(events, **core)
        self.owner = owner
        self._spoke = False  # this answer frame's audio went to the track
        self._playing: str | None = None  # the response whose audio the track plays
        self._played: str | None = None  # the last one that played

    def send_audio(self, pcm: np.ndarray) -> None:
        self._spoke = True
        if self._playing != self.response.id:  # its first audio: OpenAI's WebRTC event says so
            self._playing = self._played = self.response.id
            self.send(self.events.output_buffer("started", self.response.id))
        self.owner.out.put(pcm)

    def close_response(self, status: str, details: dict | None) -> list[str]:
        playing = self._playing if self.response is not None else None
        events = super().close_response(status, details)
        if playing is not None and playing == self._playing:
            self._playing = None
            events.append(self.events.output_buffer("stopped", playing))
        return events

    def clear_output(self) -> None:
        """output_audio_buffer.clear: the answer not yet sent is dropped."""
        self.owner.out.clear()
        if self._played is not None:
            self.send(self.events.output_buffer("cleared", self._played))

    def _answer(self, pcm: np.ndarray, piece: str) -> None:
        self._spoke = False
        super()._answer(pcm, piece)
        if not self._spoke:  # a cancelled response: silence in its place keeps time
            self.owner.out.put(np.zeros_like(pcm))

    def receive_audio(self, data: bytes) -> int:
        raise EventError("input_audio_buffer.append: a call's audio comes on its RTP track, "
                         "not in events", code="invalid_event")

    def summary(self) -> dict:
        out = super().summary()
        out.update(self.owner.figures())
        return out


class CallWire(RealtimeWire):
    name = "webrtc"

    def __init__(self, request: web.Request, call: "Call", start: dict, beta: bool):
        super().__init__(request)
        if beta:  # the beta flow's call (its page sends no OpenAI-Beta header)
            self.events = ServerEvents(beta=True)
        self.call = call
        self._start = start

    def open_session(self, **core) -> CallSession:
        session = CallSession(self.events, self.call, **core)
        refused = None
        if self._start:  # the call's starting session, as an update the client made first
            update = parse_session_update({"type": "session.update", "session": self._start})
            self._pending = self._params(session, update)
            if update.transcription is not None:
                refused = self._transcribe(session, update)
        session.send(self.events.session_created(self.view))
        if refused is not None:  # after session.created, as an update's would be
            session.send(refused)
        return session

    def _handle(self, session: CallSession, event: dict) -> None:
        if event["type"] == "output_audio_buffer.clear":  # WebRTC's own: cut the answer off
            session.clear_output()
            return
        super()._handle(session, event)

    def _update_may_come(self) -> bool:
        """For a call: while its events channel may still bring one (it is open, or not yet
        given up on) - the session.update a client sends as the channel opens still shapes the
        persona, even over the call's starting session."""
        return self.call.transport.may_get_events


class CallTransport(Transport):
    """The events of a call: its `oai-events` data channel, once open; none without one."""

    def __init__(self, call: "Call", expect_channel: bool):
        self.call = call
        self.channel = None
        self.may_get_events = expect_channel
        self._inbox: asyncio.Queue = asyncio.Queue()
        self._inbox_bytes = 0
        self._open = asyncio.Event()
        if not expect_channel:
            self._open.set()

    def attach(self, channel) -> None:
        if self.channel is not None:
            return
        self.channel = channel

        @channel.on("message")
        def on_message(message) -> None:
            if self._inbox_bytes + len(message) > MAX_INBOX_BYTES:
                self.call.session.end(f"the client sends events faster than they are read "
                                      f"(over {MAX_INBOX_BYTES} bytes wait)",
                                      WSCloseCode.POLICY_VIOLATION)
                return
            self._inbox_bytes += len(message)
            self._inbox.put_nowait(message)

        if channel.readyState == "open":
            self._opened()
        else:
            channel.on("open", self._opened)

    def _opened(self) -> None:
        if not self._open.is_set():
            self._open.set()
            self.call.wire.audio_came()

    async def opened(self) -> None:
        """Until the channel is open, or known never to be."""
        await self._open.wait()

    def give_up(self) -> None:
        """The channel did not open in time: the call goes on without events."""
        if not self._open.is_set():
            self.may_get_events = False
            self._open.set()
            self.call.wire.audio_came()

    @property
    def closed(self) -> bool:
        return self.call.closing

    async def messages(self) -> AsyncIterator[str | bytes]:
        # a call ends by its connection (or a hang-up), not by its channel: never by running dry
        while True:
            message = await self._inbox.get()
            self._inbox_bytes -= len(message)
            yield message

    async def send(self, message: str | bytes) -> None:
        await self.opened()
        channel = self.channel
        if channel is None or channel.readyState != "open":
            return  # no channel: events are not sent
        if channel.bufferedAmount > MAX_BUFFERED_BYTES:
            self.call.session.end("the client is not reading its events: "
                                  f"{channel.bufferedAmount} bytes wait",
                                  WSCloseCode.POLICY_VIOLATION)
            return
        channel.send(message)

    async def close(self, messages: list[bytes | str], reason: str | None, code: int) -> None:
        channel = self.channel
        if channel is not None and channel.readyState == "open":
            for message in messages:
                channel.send(message)
            await asyncio.sleep(0.05)  # SCTP's turn to put them on the wire
        await self.call.close()


class Call:
    """One call on a slot the caller took; `answer` gives the SDP, `run` is its life (the slot
    is freed when it ends)."""

    def __init__(self, state: ServerState, request: web.Request, offer: Offer, start: dict,
                 beta: bool = False):
        self.id = new_id("rtc")
        self.state = state
        self.peer = request.remote or "?"
        self.offer = offer
        self.closing = False
        self.transport = CallTransport(self, offer.data_channel)
        self.wire = CallWire(request, self, start, beta)
        self.session: CallSession = open_session(state, self.wire, self.peer)  # EventError
        self.pc = RTCPeerConnection(state.ice.configuration())
        model = state.model
        self.out = AnswerTrack(model.sample_rate)
        self.inbound = RtpIn(model.sample_rate, model.frame_size, self._frames)
        self.task: asyncio.Task | None = None  # run(), once answered
        self.rtt_ms: float | None = None
        self._connected = asyncio.Event()
        self._tasks: list[asyncio.Task] = []
        self._closed: asyncio.Future | None = None
        self._accounted: dict = {}

    # -- setting up -------------------------------------------------------------------------------
    async def answer(self) -> str:
        """The answer's SDP; OfferError where aiortc cannot take the offer."""
        pc, ice = self.pc, self.state.ice

        @pc.on("datachannel")
        def on_datachannel(channel) -> None:
            if channel.label == CHANNEL:
                self.transport.attach(channel)

        @pc.on("connectionstatechange")
        def on_state() -> None:
            if pc.connectionState == "connected":
                self._connected.set()
            elif pc.connectionState == "failed":
                self.fail("connection", "the call's connection failed (ICE or DTLS)")
            elif pc.connectionState == "closed" and not self.closing:
                self.session.end(None)  # the peer hung up

        # the answer's track on a transceiver made first, Opus its only codec: the offer's
        # first audio section takes it (aiortc fixes a section's codecs as it reads the offer,
        # so preferences set on a transceiver the offer made come too late)
        audio = pc.addTransceiver(self.out, direction="sendrecv")
        audio.setCodecPreferences([c for c in RTCRtpSender.getCapabilities("audio").codecs
                                   if c.name.lower() == "opus"])
        with gathering_on(ice.addresses):
            try:
                await pc.setRemoteDescription(RTCSessionDescription(
                    reachable_candidates(self.offer.sdp, ice), "offer"))
                if pc.sctp is not None:  # the events' channel: its messages as advertised
                    cap_messages(pc.sctp, MAX_MESSAGE_BYTES, self._message_too_long)
                for transceiver in pc.getTransceivers():
                    if transceiver is not audio:  # a camera, a second microphone: not heard
                        transceiver.direction = "inactive"
                await pc.setLocalDescription(await pc.createAnswer())
            except Exception as e:  # aiortc's word on an offer our checks let through
                raise OfferError(f"the offer cannot be answered ({type(e).__name__}: {e})") \
                    from None
        sdp = pc.localDescription.sdp
        media = SessionDescription.parse(sdp).media
        opus = next((c.payloadType for m in media if m.kind == "audio"
                     for c in m.rtp.codecs if c.name.lower() == "opus"), None)
        if opus is None or audio.mid is None:
            raise OfferError("the offer cannot be answered with Opus at 48000 Hz on its first "
                             "audio section")
        tap_rtp(audio.receiver, opus, self.inbound.push)
        return sdp

    # -- the call's life --------------------------------------------------------------------------
    async def run(self) -> None:
        state = self.state
        self._tasks = [asyncio.create_task(self.inbound.run()),
                       asyncio.create_task(self._watch()),
                       asyncio.create_task(self._sample())]
        if not self.offer.data_channel:  # no session.update can come: the persona is known
            self.wire.audio_came()
        try:
            await converse(state, self.wire, self.transport, self.peer, self.session)
        finally:
            await self.close()
            state.calls.pop(self.id, None)
            free_slot(state)

    def _frames(self, frames: list[np.ndarray], samples: int) -> None:
        """The playout clock's frames -> the session (only the newest while the persona is
        prefilled, as for a WebSocket's audio)."""
        session = self.session
        try:
            dropped = session.receive_frames(frames, samples)
        except ClientError as e:
            session.end(str(e), WSCloseCode.POLICY_VIOLATION)
            return
        if session.conv is None:
            dropped += session.backlog.trim(1)
        if dropped:
            self.state.stats.dropped.inc(dropped)

    async def _watch(self) -> None:
        try:
            await asyncio.wait_for(self._connected.wait(), CONNECT_TIMEOUT_S)
        except asyncio.TimeoutError:
            self.fail("ice", f"the call did not connect within {CONNECT_TIMEOUT_S:.0f} s (no "
                      "ICE candidate pair worked: the server's addresses, or --ice-server "
                      "behind NAT)")
            return
        connected = time.monotonic()
        if self.transport.may_get_events:
            try:
                await asyncio.wait_for(self.transport.opened(), CHANNEL_WAIT_S)
            except asyncio.TimeoutError:
                self.transport.give_up()
        while True:
            await asyncio.sleep(0.25)
            last = self.inbound.last_packet or connected
            if time.monotonic() - last > PEER_GONE_S:
                self.fail("peer_gone", f"the peer is gone: no audio for {PEER_GONE_S:.0f} s")
                return

    def _message_too_long(self, waiting: int) -> None:
        self.session.end(f"the client sent a data channel message over {MAX_MESSAGE_BYTES} "
                         f"bytes ({waiting} waited for the rest), the most this call's answer "
                         "allows (a=max-message-size)", WSCloseCode.MESSAGE_TOO_BIG)

    def fail(self, reason: str, message: str) -> None:
        if self.closing or self.session.ended.done():
            return
        self.state.call_metrics.failed.labels(reason=reason).inc()
        log.info("call %s (%s): %s", self.id, self.peer, message)
        self.session.end(message, WSCloseCode.GOING_AWAY)

    async def _sample(self) -> None:
        metrics = self.state.call_metrics
        while True:
            await asyncio.sleep(STATS_INTERVAL_S)
            await self._read_rtt()
            figures = self.figures()
            metrics.sample(figures)
            metrics.account(self._accounted, figures)
            self._accounted = figures

    async def _read_rtt(self) -> None:
        for sender in self.pc.getSenders():
            try:
                report = await sender.getStats()
            except Exception:  # a sender not started yet, or stopping
                continue
            for stat in report.values():
                if stat.type == "remote-inbound-rtp" and stat.roundTripTime is not None:
                    self.rtt_ms = 1000.0 * stat.roundTripTime

    def figures(self) -> dict:
        """The call's network and media figures (the session's stats and summary carry them)."""
        j = self.inbound.jitter.stats.as_dict()
        out = self.out.stats
        return {"rtt_ms": None if self.rtt_ms is None else round(self.rtt_ms, 2),
                "jitter_ms": round(j["jitter_ms"], 2), "depth_ms": round(j["depth_ms"], 2),
                "depth_mean_ms": round(j["depth_mean_ms"], 2),
                "target_ms": round(j["target_ms"], 2), "received_packets": j["received"],
                **{k: j[k] for k in ("played", "lost", "late", "duplicate", "discarded", "fec",
                                     "underruns", "concealed")},
                "concealed_ms": round(j["concealed_ms"], 1), "out_packets": out.packets,
                "out_crowded": out.crowded, "out_dropped": out.dropped,
                "clock_frames": self.inbound.frames,
                "clock_gap_max_ms": round(self.inbound.clock_gap_max_ms, 2)}

    # -- the end ----------------------------------------------------------------------------------
    def hang_up(self) -> None:
        """DELETE /v1/realtime/calls/{id}: ends the call as if the client had left."""
        self.session.end(None)

    async def close(self) -> None:
        """Closes the peer connection (its UDP ports) and stops the call's tasks; once."""
        if self._closed is not None:
            await self._closed
            return
        self.closing = True
        self._closed = asyncio.get_running_loop().create_future()
        try:
            for task in self._tasks:
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)
            figures = self.figures()
            self.state.call_metrics.account(self._accounted, figures)
            self._accounted = figures
            try:
                await asyncio.wait_for(self.pc.close(), CLOSE_TIMEOUT_S)
            except asyncio.TimeoutError:
                log.warning("call %s: its peer connection took over %.0f s to close", self.id,
                            CLOSE_TIMEOUT_S)
        finally:
            self._closed.set_result(None)
