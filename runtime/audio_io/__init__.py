"""Sound in and out of a conversation: the full-duplex loop, its sample rings, the sound
devices, and a recording paced like a microphone. numpy, soxr and sounddevice only."""
