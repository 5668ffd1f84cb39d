"""The names export and runtime agree on: graphs, their inputs and outputs, the prefixes of
state and KV rings, precisions, and the record of a TensorRT engine.

The exported model directory is the one contract between the torch side (export/) and the
torch-free side (runtime/). Both import these names; neither spells them by hand, so a rename
is one edit here and a manifest the other side cannot read is impossible to write by accident.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

# ---- graphs ---------------------------------------------------------------------------------
MIMI_ENCODER = "mimi_encoder"
MIMI_DECODER = "mimi_decoder"
HELIUM_STEP = "helium_step"
DEPFORMER_STEP = "depformer_step"
TRANSCRIBER_STEP = "transcriber_step"  # Kyutai's STT step, beside the LM (transcriber.py)
CODEC_GRAPHS = (MIMI_ENCODER, MIMI_DECODER)  # always float32
LM_GRAPHS = (HELIUM_STEP, DEPFORMER_STEP)

# ---- graph inputs and outputs -----------------------------------------------------------------
# Mimi: one frame per call
PCM = "pcm"  # [B, 1, samples_per_frame] float32
CODES = "codes"  # [B, num_codebooks] int64
# Helium: one step over F frames (F = 1 live; the persona prefill runs many in one call)
TOKENS = "tokens"  # [B, F, 17] int64
EXTRA_EMBEDDING = "extra_embedding"  # [B, F, D] float32, added to the frame's input embedding
POSITION = "position"  # [B] int64: the absolute position of the call's first frame
TEXT_NOISE = "text_noise"  # [B, K_max] float32 Gumbel noise (zeros: greedy)
TEXT_TEMPERATURE = "text_temperature"  # [B] float32
TEXT_TOP_K = "text_top_k"  # [B] int64
TEXT_TOKEN = "text_token"  # [B] int64, sampled from the last frame's logits
HIDDEN = "hidden"  # [B, D] float32, the last frame's hidden state
# depformer: the agent's codebooks of one frame
AUDIO_NOISE = "audio_noise"  # [B, codebooks, K_max] float32
AUDIO_TEMPERATURE = "audio_temperature"  # [B] float32
AUDIO_TOP_K = "audio_top_k"  # [B] int64
AUDIO_TOKENS = "audio_tokens"  # [B, codebooks] int64
# transcriber: tokens [B, 1, 1 + n_q] (its last text token, the user's n_q codes), position,
# its KV ring -> text_token [B] (greedy) and, with VAD heads, their probabilities
VAD = "vad"  # [B, heads, classes] float32: each head's softmax (class 0: no voice ahead)

FRAMES_AXIS = "frames"  # the name of Helium's dynamic frames axis in the graph

# ---- state and KV rings -----------------------------------------------------------------------
STATE_INPUT_PREFIX = "past."  # a state tensor goes in as past.<name> ...
STATE_OUTPUT_PREFIX = "present."  # ... and comes back as present.<name>
KV_INPUT_PREFIX = "past_key_values."  # Helium's rings: past_key_values.<layer>.key|value
KV_OUTPUT_PREFIX = "present."  # the step's new rows: present.<layer>.key|value
MIMI_RING_PREFIX = "ring."  # Mimi transformer rings: ring.<module>.key|value
MIMI_ROWS_PREFIX = "rows."  # and their new rows: rows.<module>.key|value
KV_KINDS = ("key", "value")


def kv_input(layer: int, kind: str) -> str:
    return f"{KV_INPUT_PREFIX}{layer}.{kind}"


def kv_output(layer: int, kind: str) -> str:
    return f"{KV_OUTPUT_PREFIX}{layer}.{kind}"


def state_input(name: str) -> str:
    return STATE_INPUT_PREFIX + name


def state_output(name: str) -> str:
    return STATE_OUTPUT_PREFIX + name


# ---- precisions and backends ------------------------------------------------------------------
PRECISIONS = ("fp32", "fp16", "bf16", "int8", "int4", "fp8")
BACKENDS = ("onnx", "tensorrt")
# where a loaded model's graphs run (`--device`, the assistant's `device`; runtime/backends)
DEVICES = ("auto", "cpu", "cuda", "webgpu")
DTYPES = ("float32", "float16", "bfloat16", "int64", "int32", "bool")


# ---- TensorRT engines -------------------------------------------------------------------------
@dataclass(frozen=True)
class EngineSpec:
    """What a serialized TensorRT engine was built with and for. An engine runs only with the
    library version that built it. Mainline TensorRT's runs on the GPU model it was tuned for
    (kernels are chosen by timing on that GPU: another model of the same compute capability,
    H100 against H200, has other memory and clocks); TensorRT for RTX's on any GPU of its
    `targets` (it compiles the kernels there). The runtime compares all of it before
    deserialising."""

    file: str  # the serialized engine, relative to the model directory
    sha256: str
    tensorrt_version: str  # the builder's library version, e.g. "10.8.0.43", "1.7.1.116"
    compute_capability: str  # "9.0" (H100/H200), "8.7" (Jetson Orin); "" for TensorRT for RTX
    device_name: str  # "NVIDIA H200"; "" for TensorRT for RTX (built for targets, not a GPU)
    precision: str  # the graph's precision when built
    build_seconds: float = 0.0
    device_memory: int = 0  # bytes of GPU memory (0: not recorded by older exports)
    weight_bytes: int = 0  # the weight bytes the graph holds, for the engine-size check
    library: str = "tensorrt"  # "tensorrt" (mainline) or "tensorrt-rtx" (TensorRT for RTX)
    targets: tuple[str, ...] = ()  # TensorRT for RTX: the compute capabilities, "8.6", "12.0"
    weightless: bool = False  # no weights in the plan: refit from the graph's ONNX when loaded

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "targets": list(self.targets)}  # as JSON gives it back

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "EngineSpec":
        return cls(d["file"], d["sha256"], d["tensorrt_version"], d["compute_capability"],
                   d.get("device_name", "?"), d.get("precision", "?"),
                   float(d.get("build_seconds", 0.0)), int(d.get("device_memory", 0)),
                   int(d.get("weight_bytes", 0)), d.get("library", "tensorrt"),
                   tuple(str(cc) for cc in d.get("targets", ())), bool(d.get("weightless")))
