"""`personaplex-edge assistant`: the duplex loop as a long-lived service - a TOML config, devices
that come and go, sleep when idle and wake on a voice, systemd's notify protocol and a local
control socket (docs/assistant.md)."""
