"""The Prometheus metrics of WebRTC calls, on the server's registry (stats.py): what the network
did to them (round trip, jitter, loss, late packets), what the jitter buffer did about it
(concealed packets, FEC, its depth), what the way out did (packets dropped), and calls that never
connected or whose peer vanished."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram

# 1 ms .. 1 s
_NET_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.12, 0.2, 0.3, 0.5, 1.0)
# what the jitter buffer's counters feed, by the name of their field in JitterStats
INBOUND = ("played", "lost", "late", "duplicate", "discarded")


class CallMetrics:
    def __init__(self, registry: CollectorRegistry):
        r = registry
        self.failed = Counter("personaplex_webrtc_calls_failed",
                              "Calls ended by the network, by reason (ice: never connected; "
                              "peer_gone: no audio for a few seconds; connection: DTLS/ICE "
                              "failed)", ["reason"], registry=r)
        self.packets = Counter("personaplex_webrtc_rtp_packets",
                               "Inbound RTP packets by outcome (played, lost, late, duplicate, "
                               "discarded)", ["outcome"], registry=r)
        self.concealed = Counter("personaplex_webrtc_concealed_packets",
                                 "20 ms packets the model heard concealed (lost or underrun), "
                                 "by how (fec, plc)", ["how"], registry=r)
        self.dropped_out = Counter("personaplex_webrtc_out_dropped_packets",
                                   "Outbound packets dropped from a queue grown past 0.2 s",
                                   registry=r)
        self.rtt = Histogram("personaplex_webrtc_rtt_seconds",
                             "Round trip to the peer (RTCP), sampled each second per call",
                             buckets=_NET_BUCKETS, registry=r)
        self.jitter = Histogram("personaplex_webrtc_jitter_seconds",
                                "Inbound interarrival jitter (RFC 3550), sampled each second "
                                "per call", buckets=_NET_BUCKETS, registry=r)
        self.depth = Histogram("personaplex_webrtc_jitter_buffer_seconds",
                               "Audio waiting in the jitter buffer, sampled each second per "
                               "call", buckets=_NET_BUCKETS, registry=r)

    def account(self, before: dict, now: dict) -> None:
        """The counters' growth between two readings of a call's figures."""
        for outcome in INBOUND:
            grown = now[outcome] - before.get(outcome, 0)
            if grown > 0:
                self.packets.labels(outcome=outcome).inc(grown)
        fec = now["fec"] - before.get("fec", 0)
        plc = (now["concealed"] - before.get("concealed", 0)) - fec
        if fec > 0:
            self.concealed.labels(how="fec").inc(fec)
        if plc > 0:
            self.concealed.labels(how="plc").inc(plc)
        dropped = now["out_dropped"] - before.get("out_dropped", 0)
        if dropped > 0:
            self.dropped_out.inc(dropped)

    def sample(self, figures: dict) -> None:
        if figures.get("rtt_ms") is not None:
            self.rtt.observe(figures["rtt_ms"] / 1000.0)
        self.jitter.observe(figures["jitter_ms"] / 1000.0)
        self.depth.observe(figures["depth_ms"] / 1000.0)
