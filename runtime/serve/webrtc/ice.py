"""Where a call's media may flow: the ICE candidates the server offers and the ones it takes.

- Host candidates are the server's own addresses: the address it listens on (`--host`; every
  interface's for 0.0.0.0 or ::, loopback included), so a server that only this machine may
  reach opens no UDP port any other machine could. aioice (aiortc's ICE) gathers every
  non-loopback interface itself; `gathering_on` narrows it, for the calls of this server only
  (a context variable, so an aiortc client in the same process gathers as it would anyway).
- STUN and TURN servers (`--ice-server`) only where configured: nothing is contacted by
  default (aiortc's own default is a public STUN server; an empty list turns it off).
- A server whose addresses are all loopback takes from an offer only the candidates whose
  address is this machine's own: loopback, or the address of one of its interfaces. Traffic to
  an address of its own never leaves a machine (the kernel delivers it through loopback), so
  a client on the same machine is reached wherever it gathered (aiortc gathers no loopback
  candidate at all), and nothing is ever sent to another one. Where it took candidates out, the
  offer's end-of-candidates goes too: the server still answers with its own candidates (aioice
  would drop a component left without remote candidates, and answer with none) and learns the
  client's from the checks that reach it - which only this machine can send to its loopback.
  A browser's mDNS names (`*.local`) are never resolved: that would be multicast on the LAN.
"""

from __future__ import annotations

import contextlib
import contextvars
import ipaddress
import socket
from dataclasses import dataclass

_ADDRESSES: contextvars.ContextVar[tuple[str, ...] | None] = contextvars.ContextVar(
    "personaplex_ice_addresses", default=None)
_INSTALLED = False


@dataclass(frozen=True)
class IceOptions:
    addresses: tuple[str, ...]  # the host candidates' addresses
    servers: tuple[str, ...] = ()  # stun:HOST[:PORT], turn:HOST[:PORT][?transport=udp|tcp]
    username: str | None = None  # for the TURN servers
    credential: str | None = None

    @property
    def loopback_only(self) -> bool:
        return all(ipaddress.ip_address(a).is_loopback for a in self.addresses)

    def configuration(self):
        """aiortc's RTCConfiguration: these servers, and none of aiortc's defaults."""
        from aiortc import RTCConfiguration, RTCIceServer

        servers = [RTCIceServer(urls=url, username=self.username, credential=self.credential)
                   if url.startswith("turn") else RTCIceServer(urls=url)
                   for url in self.servers]
        return RTCConfiguration(iceServers=servers)


def interface_addresses(ipv6: bool) -> list[str]:
    """Every address of this machine's interfaces (loopback first), not link-local ones
    (none without ifaddr, which comes with aiortc: no calls are served then)."""
    try:
        import ifaddr
    except ImportError:
        return []

    out = []
    for adapter in ifaddr.get_adapters():
        for ip in adapter.ips:
            if isinstance(ip.ip, str):
                out.append(ip.ip)
            elif ipv6 and ip.ip[2] == 0:  # (address, flowinfo, scope id): scoped is link-local
                out.append(ip.ip[0])
    return sorted(set(out), key=lambda a: (not ipaddress.ip_address(a).is_loopback, a))


def host_addresses(listen_host: str) -> tuple[str, ...]:
    """The host candidates' addresses for a server listening on `listen_host`."""
    if listen_host in ("0.0.0.0", ""):
        return tuple(interface_addresses(ipv6=False))
    if listen_host == "::":
        return tuple(interface_addresses(ipv6=True))
    try:
        return (str(ipaddress.ip_address(listen_host)),)
    except ValueError:  # a name: its addresses
        infos = socket.getaddrinfo(listen_host, None, type=socket.SOCK_DGRAM)
        return tuple(dict.fromkeys(info[4][0] for info in infos))


def _gather_addresses(use_ipv4: bool, use_ipv6: bool) -> list[str]:
    addresses = _ADDRESSES.get()
    if addresses is None:
        return _original(use_ipv4=use_ipv4, use_ipv6=use_ipv6)
    return [a for a in addresses
            if (use_ipv4 if ipaddress.ip_address(a).version == 4 else use_ipv6)]


_original = None


def _install() -> None:
    global _INSTALLED, _original
    if _INSTALLED:
        return
    import aioice.ice

    _original = aioice.ice.get_host_addresses
    aioice.ice.get_host_addresses = _gather_addresses
    _INSTALLED = True


@contextlib.contextmanager
def gathering_on(addresses: tuple[str, ...]):
    """Within: aioice's host candidates (of the calls set up here) are `addresses`."""
    _install()
    token = _ADDRESSES.set(tuple(addresses))
    try:
        yield
    finally:
        _ADDRESSES.reset(token)


def reachable_candidates(sdp: str, options: IceOptions) -> str:
    """The offer as this server takes it: on loopback only, the candidates at this machine's own
    addresses kept and the rest (with the end-of-candidates that would close the list) taken
    out; elsewhere as it is."""
    if not options.loopback_only:
        return sdp
    own = {ipaddress.ip_address(a) for a in interface_addresses(ipv6=True)}
    lines = sdp.splitlines()
    dropped = [line for line in lines if line.startswith("a=candidate:")
               and not _on_this_machine(line, own)]
    if not dropped:
        return sdp
    kept = [line for line in lines if line not in dropped and line != "a=end-of-candidates"]
    return "\r\n".join(kept) + "\r\n"


def _on_this_machine(line: str, own: set) -> bool:
    # a=candidate:FOUNDATION COMPONENT TRANSPORT PRIORITY ADDRESS PORT typ TYPE ...
    fields = line.split()
    try:
        address = ipaddress.ip_address(fields[4])
    except (IndexError, ValueError):  # a name (mDNS .local): not resolved here
        return False
    return address.is_loopback or address in own
