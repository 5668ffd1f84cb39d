"""`personaplex-edge devices`: the sound devices, for --input-device / --output-device."""

from __future__ import annotations


def add_parser(sub) -> None:
    d = sub.add_parser("devices", help="list sound devices (for --input-device/--output-device)")
    d.set_defaults(func=run)


def run(args) -> int:
    from ..runtime.audio_io.devices import list_devices

    print(list_devices())
    return 0
