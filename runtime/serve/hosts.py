"""Which names this server answers to: the `Host` allow list, on every route that serves the
page, the voices or a WebSocket.

The origin check (auth.py) admits a page whose Origin is the server's own, judged by the Host
header. DNS rebinding defeats that alone: a page on `http://evil.example:8998`, whose name its
owner re-points at 127.0.0.1, sends `Origin: http://evil.example:8998` and `Host:
evil.example:8998`, so its origin is "the server's own". A browser always sends the name it
resolved as Host, and an attacker's page can only carry the attacker's name, so a server that
answers only to its own names is out of reach (Jupyter's local_hostnames, webpack-dev-server's
allowedHosts, Ollama since CVE-2024-28224).

Admitted by default: the loopback names (`localhost`, `*.localhost`) and addresses, the
`--host` value, and, when bound beyond loopback, this machine's names (its host name, its
fully qualified name, `NAME.local` for mDNS) and any IP address (an address is not a name
anyone can re-point; a LAN client reaches the box by one, behind NAT maybe one the box does not
know). `--allowed-hosts` adds names (a balancer's or a proxy's public name); `*` admits any
(a fleet behind a balancer that checks names itself). A request without Host is not a
browser's (HTTP/1.1 browsers always send one) and is admitted.
"""

from __future__ import annotations

import ipaddress
import socket
from dataclasses import dataclass

from personaplex_edge.errors import PersonaPlexError

ANY_HOST = "*"
LOOPBACK_NAMES = frozenset({"localhost"})
# what a server bound to one of these listens on: every interface, not one name
EVERY_INTERFACE = frozenset({"", "0.0.0.0", "::"})


def _address(name: str):
    try:
        return ipaddress.ip_address(name)
    except ValueError:
        return None


def _normal(name: str) -> str:
    """A host name as compared: lower case, no trailing dot, an IPv6 address without its
    brackets."""
    name = name.strip().lower().rstrip(".")
    if name.startswith("[") and name.endswith("]"):
        name = name[1:-1]
    return name


def host_name(header: str) -> str:
    """A Host header's name, its port dropped ("[::1]:8998" -> "::1", "a.b:80" -> "a.b")."""
    header = header.strip()
    if header.startswith("["):  # [v6]:port
        return _normal(header[:header.find("]") + 1] if "]" in header else header)
    if header.count(":") == 1:  # name:port (a bare v6 address has several)
        header = header.split(":", 1)[0]
    return _normal(header)


def parse_allowed_hosts(values) -> tuple[str, ...]:
    """`--allowed-hosts` entries ("voice.example.com", "10.0.0.5", "*") -> normalised; a value
    that is not a host name is an error naming the flag."""
    out = []
    for value in values:
        name = _normal(value)
        if not name:
            continue
        if name != ANY_HOST and _address(name) is None and (
                any(c in name for c in "/:@?# ") or "*" in name):
            raise PersonaPlexError(f"--allowed-hosts: {value!r} is not a host name; give names "
                                   "as a browser's address bar shows them, without scheme or "
                                   "port (e.g. voice.example.com), or *")
        out.append(name)
    return tuple(out)


def beyond_loopback(bind_host: str) -> bool:
    """Whether a server bound to `bind_host` can be reached from other machines."""
    name = _normal(bind_host)
    if name in LOOPBACK_NAMES:
        return False
    address = _address(name)
    return address is None or not address.is_loopback


def machine_names() -> frozenset[str]:
    """This machine's own names, as a LAN client may type them."""
    names = set()
    for ask in (socket.gethostname, socket.getfqdn):
        try:
            name = _normal(ask())
        except OSError:
            continue
        if name:
            names.add(name)
            names.add(name.split(".", 1)[0] + ".local")
    return frozenset(names)


@dataclass(frozen=True)
class HostRule:
    """The names one server answers to (`admits`)."""

    names: frozenset[str]
    any_name: bool = False  # `*`
    any_address: bool = False  # bound beyond loopback: any IP address

    @classmethod
    def for_server(cls, bind_host: str, allowed: tuple[str, ...] = ()) -> "HostRule":
        """The default for a server bound to `bind_host`, plus `allowed` (parsed)."""
        names = set(LOOPBACK_NAMES) | set(allowed)
        outward = beyond_loopback(bind_host)
        if _normal(bind_host) not in EVERY_INTERFACE:
            names.add(_normal(bind_host))
        if outward:
            names |= machine_names()
        return cls(frozenset(names - {ANY_HOST}), any_name=ANY_HOST in allowed,
                   any_address=outward)

    def admits(self, header: str | None) -> bool:
        if self.any_name or not header:
            return True
        name = host_name(header)
        if name in self.names or name.endswith(".localhost"):  # RFC 6761: always loopback
            return True
        address = _address(name)
        return address is not None and (self.any_address or address.is_loopback)
