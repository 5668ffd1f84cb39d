"""A call's offer as a client posts it to `/v1/realtime/calls`, read and checked before any
port is opened: the SDP alone (`Content-Type: application/sdp`, OpenAI's browser quick-start),
or a multipart form with the SDP in `sdp` and the call's starting session (JSON) in `session`
(OpenAI's "unified" flow, from an app's backend).

What a call needs of the offer, each missing piece a 400 that names it: a parseable SDP, an
audio section the client sends on (sendrecv or sendonly: the model listens and speaks at once),
Opus among its codecs as RFC 7587 names it (opus/48000/2), and the ICE credentials and DTLS
fingerprint of a WebRTC peer. A data section (the `oai-events` channel) is optional: without it
the call converses, silently.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from aiohttp import web

MAX_OFFER_BYTES = 64 << 10  # a browser's offer is a few kB
OPUS_CLOCK_RATE = 48000  # RTP's clock (and SDP's name) for every Opus stream


class OfferError(ValueError):
    """An offer this server cannot answer: 400 with the message."""


@dataclass(frozen=True)
class Offer:
    sdp: str
    session: dict = field(default_factory=dict)  # the multipart form's session, if any
    data_channel: bool = False  # the offer negotiates SCTP (where `oai-events` would run)


async def read_offer(request: web.Request) -> tuple[str, dict]:
    """The posted SDP and the form's session ({} when none); OfferError for a body that is
    neither form."""
    kind = request.content_type
    if kind in ("multipart/form-data", "application/x-www-form-urlencoded"):
        form = await request.post()
        sdp, session = form.get("sdp"), form.get("session")
        sdp = _text(sdp, "sdp")
        if session is None:
            return sdp, {}
        try:
            config = json.loads(_text(session, "session"))
        except ValueError as e:
            raise OfferError(f"the form's session is not JSON ({e})") from None
        if not isinstance(config, dict):
            raise OfferError("the form's session must be a JSON object")
        return sdp, config
    if kind not in ("application/sdp", "text/plain"):
        raise OfferError(f"an offer is posted as application/sdp (or a multipart form with "
                         f"`sdp` and `session`), not {kind or 'no content type'}")
    body = await request.read()
    if len(body) > MAX_OFFER_BYTES:
        raise OfferError(f"an offer of {len(body)} bytes is over the limit of {MAX_OFFER_BYTES}")
    try:
        return body.decode("utf-8"), {}
    except UnicodeDecodeError:
        raise OfferError("the offer is not UTF-8 text") from None


def _text(value, name: str) -> str:
    if value is None:
        raise OfferError(f"the form has no `{name}` field")
    if hasattr(value, "file"):  # sent as a file part
        value = value.file.read()
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    if len(value) > MAX_OFFER_BYTES:
        raise OfferError(f"the form's `{name}` is over the limit of {MAX_OFFER_BYTES} bytes")
    return value


def check_offer(sdp: str, session: dict) -> Offer:
    """The offer, checked (OfferError naming what is wrong or missing)."""
    from aiortc.sdp import SessionDescription

    if not sdp.strip():
        raise OfferError("the offer is empty: post the SDP of the peer connection's offer")
    if not sdp.lstrip().startswith("v=0"):
        raise OfferError("not an SDP offer: it must start with v=0")
    try:
        desc = SessionDescription.parse(sdp)
    except Exception as e:  # aiortc's parser raises whatever its fields trip on
        raise OfferError(f"the offer's SDP does not parse ({type(e).__name__}: {e})") from None
    audio = [m for m in desc.media if m.kind == "audio"]
    if not audio:
        raise OfferError("the offer has no audio section (m=audio): add the microphone's "
                         "track before createOffer")
    first = audio[0]
    if first.direction not in (None, "sendrecv", "sendonly"):
        raise OfferError(f"the offer's audio is {first.direction}: the model hears what the "
                         "client sends, so the microphone's track must be sendrecv")
    opus = [c for c in first.rtp.codecs if c.name.lower() == "opus"]
    if not opus:
        raise OfferError("the offer's audio has no Opus codec: this server speaks Opus at 48 kHz")
    if not any(c.clockRate == OPUS_CLOCK_RATE and c.channels == 2 for c in opus):
        rates = ", ".join(f"opus/{c.clockRate}/{c.channels}" for c in opus)
        raise OfferError(f"the offer's Opus is {rates}: WebRTC's Opus is opus/{OPUS_CLOCK_RATE}/2 "
                         "(RFC 7587), whatever rate it is coded at")
    if not (first.ice.usernameFragment and first.ice.password):
        raise OfferError("the offer has no ICE credentials (a=ice-ufrag, a=ice-pwd): not a "
                         "WebRTC offer")
    if not first.dtls.fingerprints:
        raise OfferError("the offer has no DTLS fingerprint (a=fingerprint): not a WebRTC offer")
    return Offer(sdp=sdp, session=session,
                 data_channel=any(m.kind == "application" for m in desc.media))
