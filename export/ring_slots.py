"""What each slot of a KV ring holds, as graph arithmetic the GPU runs.

A ring of T slots keeps the key of absolute position p in slot p % T. Before a call at `position`,
slot j holds the newest position p_j < position with p_j = j (mod T) - negative when nothing
was written there yet. Both rings, Helium's and the Mimi transformer's, mask by it.
"""

from __future__ import annotations

import torch


def newest_positions(position: torch.Tensor, capacity: int) -> torch.Tensor:
    """position [B] int64 (the call's first position) -> [B, T]: p_j of every slot j."""
    slots = torch.arange(capacity, dtype=torch.int64)  # [T]
    last = position[:, None] - 1  # [B, 1]
    # (last - j) mod T with its argument made non-negative (last >= -1, so last + T - j >= 0),
    # where a truncating division is the floor: a Div, a Mul and a Sub, which WebGPU runs on
    # the GPU - ONNX's Mod has no WebGPU kernel and would send the positions through the host
    age = last + capacity - slots[None, :]  # [B, T]
    age = age - torch.div(age, capacity, rounding_mode="trunc") * capacity
    return last - age
