"""A network namespace of the tests' own for the WebRTC calls they make: inside it, nothing a
call does can leave this machine.

    in_own_network(argv)            argv with only a loopback (a browser's call: chromium
                                    gathers loopback when told to)
    in_own_network(argv, nic=True)  a loopback and one interface (NIC) with an address, as a
                                    machine has (aiortc and libwebrtc gather it): a veth whose
                                    peer is in the same namespace, IPv6 off so the kernel says
                                    nothing on it unasked; `sent_packets(NIC)` counts what went
                                    out through it

Needs root, unshare and ip (CI runs as root); elsewhere argv as it is (a developer's own machine:
the server on loopback still sends nothing off it).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

NIC = "pe0"
NIC_ADDRESS = "10.99.0.1/24"

_LOOPBACK = "ip link set lo up"
_WITH_NIC = (f"{_LOOPBACK} && ip link add {NIC} type veth peer name pe1 && "
             f"echo 1 > /proc/sys/net/ipv6/conf/{NIC}/disable_ipv6 && "
             "echo 1 > /proc/sys/net/ipv6/conf/pe1/disable_ipv6 && "
             f"ip addr add {NIC_ADDRESS} dev {NIC} && ip link set pe1 up && ip link set {NIC} up")


def can_isolate() -> bool:
    return os.geteuid() == 0 and bool(shutil.which("unshare")) and bool(shutil.which("ip"))


def in_own_network(argv: list[str], nic: bool = False) -> list[str]:
    if not can_isolate():
        return argv
    setup = _WITH_NIC if nic else _LOOPBACK
    return ["unshare", "--net", "sh", "-c", f'{setup} && exec "$0" "$@"', *argv]


def sent_packets(interface: str) -> int | None:
    """Packets `interface` has sent (None where there is no such interface: not isolated);
    from /proc/net/dev, which is the namespace's own."""
    for line in Path("/proc/net/dev").read_text().splitlines()[2:]:
        name, _, fields = line.partition(":")
        if name.strip() == interface:
            return int(fields.split()[9])  # receive: 8 fields; transmit: bytes, packets, ...
    return None
