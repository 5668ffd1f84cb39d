"""Streaming convolutions whose state is data.

Every streaming module here has `forward(x, state) -> (y, new_state)`, where `state` maps state
names to tensors and `new_state` holds what this module changed. Nothing is kept on the module
between calls, so one call traces into a pure ONNX graph. A module's state names are its path in
the model (assigned by `name_states`), e.g. `encoder.model.3.prev`.
"""

from __future__ import annotations

import torch
from torch import nn

from personaplex_edge.contract import STATE_INPUT_PREFIX
from personaplex_edge.manifest import RingSpec, StateSpec

State = dict[str, torch.Tensor]


class Stateful(nn.Module):
    """A module that owns streaming state tensors, declared by `own_state`."""

    state_key: str = ""

    def own_state(self, batch: int) -> list[StateSpec]:
        raise NotImplementedError


def name_states(root: nn.Module, prefix: str = "") -> None:
    """Gives every stateful module under `root` its path as state name prefix."""
    for name, module in root.named_modules():
        if isinstance(module, Stateful):
            module.state_key = ".".join(p for p in (prefix, name) if p)


def collect_state(root: nn.Module, batch: int) -> list[StateSpec]:
    specs: list[StateSpec] = []
    for module in root.modules():
        if isinstance(module, Stateful):
            specs.extend(module.own_state(batch))
    names = [s.name for s in specs]
    assert len(set(names)) == len(names), "state names must be unique; call name_states first"
    return specs


class StreamConv1d(Stateful):
    """Causal Conv1d. State `prev` holds the last (effective kernel - stride) input samples, zeros
    at the start. With `replicate_first`, the very first call pads with copies of its first sample
    instead (Mimi's downsampling conv); a `first` flag in the state (1 then 0) selects that without
    control flow."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, stride: int = 1,
                 dilation: int = 1, groups: int = 1, bias: bool = True,
                 replicate_first: bool = False):
        super().__init__()
        self.conv = nn.Conv1d(in_channels, out_channels, kernel_size, stride,
                              dilation=dilation, groups=groups, bias=bias)
        self.context = (kernel_size - 1) * dilation + 1 - stride
        self.replicate_first = replicate_first and self.context > 0

    def own_state(self, batch: int) -> list[StateSpec]:
        specs = []
        if self.context > 0:
            specs.append(StateSpec(f"{self.state_key}.prev",
                                   (batch, self.conv.in_channels, self.context), "float32"))
        if self.replicate_first:
            specs.append(StateSpec(f"{self.state_key}.first", (batch, 1, 1), "float32", 1.0))
        return specs

    def forward(self, x: torch.Tensor, state: State) -> tuple[torch.Tensor, State]:
        # x: [B, C, T], T a multiple of the stride
        if self.context == 0:
            return self.conv(x), {}
        prev = state[f"{self.state_key}.prev"]  # [B, C, context]
        new: State = {}
        if self.replicate_first:
            first = state[f"{self.state_key}.first"]  # [B, 1, 1]
            prev = first * x[..., :1] + (1.0 - first) * prev
            new[f"{self.state_key}.first"] = torch.zeros_like(first)
        x = torch.cat([prev, x], dim=-1)  # [B, C, context + T]
        new[f"{self.state_key}.prev"] = x[..., -self.context:]
        return self.conv(x), new


class StreamConvTranspose1d(Stateful):
    """Causal ConvTranspose1d. Each call emits stride * T samples; the (kernel - stride) overlap
    tail that later inputs still add to is kept in state `tail`, without the bias (the bias is
    added once, when the samples are emitted)."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, stride: int,
                 groups: int = 1, bias: bool = True):
        super().__init__()
        self.convtr = nn.ConvTranspose1d(in_channels, out_channels, kernel_size, stride,
                                         groups=groups, bias=bias)
        self.overlap = kernel_size - stride
        # With kernel = 2 x stride (all of Mimi's dense ones) the transposed conv is one MatMul
        # per input step plus an overlap-add of two halves: onnxruntime runs that MatMul on
        # prepacked weights, much faster than its ConvTranspose on a handful of steps.
        self.as_matmul = groups == 1 and kernel_size == 2 * stride

    def own_state(self, batch: int) -> list[StateSpec]:
        if self.overlap <= 0:
            return []
        return [StateSpec(f"{self.state_key}.tail",
                          (batch, self.convtr.out_channels, self.overlap), "float32")]

    def forward(self, x: torch.Tensor, state: State) -> tuple[torch.Tensor, State]:
        if self.as_matmul:
            return self._forward_matmul(x, state)
        y = self.convtr(x)  # [B, C_out, (T - 1) * stride + kernel]
        if self.overlap <= 0:
            return y, {}
        tail = state[f"{self.state_key}.tail"]  # [B, C_out, overlap]
        n = self.overlap
        head = y[..., :n] + tail
        body = y[..., n:-n]
        rest = y[..., -n:]
        if self.convtr.bias is not None:
            rest = rest - self.convtr.bias[:, None]
        return torch.cat([head, body], dim=-1), {f"{self.state_key}.tail": rest}

    def _forward_matmul(self, x: torch.Tensor, state: State) -> tuple[torch.Tensor, State]:
        B, C, T = x.shape
        w = self.convtr.weight  # [C_in, C_out, 2S]
        C_out, S = w.shape[1], self.convtr.stride[0]
        z = torch.matmul(x.transpose(1, 2), w.reshape(C, C_out * 2 * S))  # [B, T, C_out*2S]
        z = z.reshape(B, T, C_out, 2, S)
        first, second = z[:, :, :, 0], z[:, :, :, 1]  # [B, T, C_out, S] each
        tail = state[f"{self.state_key}.tail"]  # [B, C_out, S]: last call's second half
        earlier = torch.cat([tail[:, None], second[:, :-1]], dim=1)  # [B, T, C_out, S]
        y = (first + earlier).permute(0, 2, 1, 3).reshape(B, C_out, T * S)  # [B, C_out, T*S]
        if self.convtr.bias is not None:
            y = y + self.convtr.bias[:, None]
        return y, {f"{self.state_key}.tail": second[:, -1]}


def advance(state: State, new: State, rings: list[RingSpec]) -> None:
    """Applies one call's results to a torch-side stream, as the runtime does: state tensors
    are replaced, each ring gets its new rows at the position its `position` state held before
    the call."""
    positions = {r.input_name: int(state[r.position.removeprefix(STATE_INPUT_PREFIX)].flatten()[0])
                 for r in rings}
    for r in rings:
        r.write(state[r.input_name], new[r.output_name], positions[r.input_name])
    state.update({k: v for k, v in new.items() if k in state})


def rings_as_io(step, rings: list[RingSpec]):
    """`step(x, state) -> (y, new)` as a graph step whose rings are explicit inputs after x and
    whose new rows are outputs after y: `fn(x, *rings, state) -> ((y, *rows), new)`."""
    names_in = [r.input_name for r in rings]
    names_out = [r.output_name for r in rings]

    def fn(x, *args):
        *ring_tensors, state = args
        y, new = step(x, {**state, **dict(zip(names_in, ring_tensors))})
        return (y, *[new[n] for n in names_out]), new

    return fn
