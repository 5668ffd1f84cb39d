"""Which WebGPU adapter runs the graphs, through onnxruntime's WebGPU provider (the PyPI plugin
`onnxruntime-ep-webgpu`): Dawn over Vulkan (Linux, Jetson boards, Android), Metal (macOS) and
D3D12 (Windows), so AMD, Intel, Apple, Qualcomm and NVIDIA GPUs alike.

    plugin installed?  ->  Vulkan loader present (Linux)?  ->  the provider's devices
      -> a hardware adapter (or a software one, only where asked)  ->  a first run: shader-f16?

The provider offers a device only for a GPU, unless its own switch
ORT_WEBGPU_EP_ALLOW_SOFTWARE_ADAPTER=1 is set, when it also offers the CPU through a software
Vulkan driver (SwiftShader, as CI runs it): `auto` never takes a software adapter, `--device
webgpu` takes one only where that switch is set. Every way this can fail is one
WebGpuUnavailable naming what to install or set.

onnxruntime's Python API names the adapter's PCI vendor and device only; on Linux the Vulkan
loader is asked for the device's own name (vkGetPhysicalDeviceProperties through ctypes), which
is what the one line a load prints carries.
"""

from __future__ import annotations

import ctypes
import functools
import os
import sys
from dataclasses import dataclass

from personaplex_edge.errors import PersonaPlexError

from .ort_install import import_onnxruntime

PLUGIN = "onnxruntime-ep-webgpu"
EP_NAME = "WebGpuExecutionProvider"
SOFTWARE_SWITCH = "ORT_WEBGPU_EP_ALLOW_SOFTWARE_ADAPTER"
MIN_ONNXRUNTIME = (1, 24, 4)  # the plugin's own floor
INSTALL = "pip install 'personaplex-edge[webgpu]'"

# PCI vendor ids of the GPUs WebGPU serves (and SwiftShader's, Google's)
VENDORS = {0x10DE: "NVIDIA", 0x1002: "AMD", 0x1022: "AMD", 0x8086: "Intel", 0x106B: "Apple",
           0x5143: "Qualcomm", 0x13B5: "Arm", 0x1010: "Imagination", 0x1AE0: "Google"}
# Dawn's backend on each platform
BACKENDS = {"linux": "Vulkan", "darwin": "Metal", "win32": "D3D12"}
_VK_TYPES = {1: "integrated", 2: "discrete", 3: "virtual", 4: "software"}


class WebGpuUnavailable(PersonaPlexError):
    """No WebGPU adapter can run the graphs here; the message says why and what to do."""


@dataclass(frozen=True)
class WebGpuAdapter:
    ep_device: object  # onnxruntime's OrtEpDevice: what a session is created for
    name: str  # "AMD Radeon RX 7600 (RADV NAVI33)", "SwiftShader Device (Subzero)"
    vendor: str
    kind: str  # "discrete", "integrated", "virtual", "software" or "gpu" (not known)
    backend: str  # Vulkan, Metal or D3D12
    shader_f16: bool  # float16 arithmetic in shaders: what fp16 weights and islands need

    @property
    def software(self) -> bool:
        return self.kind == "software"

    def describe(self) -> str:
        f16 = "shader-f16" if self.shader_f16 else "no shader-f16"
        return f"{self.name} ({self.vendor}, {self.kind}, {self.backend}, {f16})"


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split("+")[0].split(".")[:3] if x.isdigit())


def _plugin_library() -> str:
    try:
        import onnxruntime_ep_webgpu
    except ImportError:
        raise WebGpuUnavailable(f"onnxruntime's WebGPU provider is not installed ({INSTALL})") \
            from None
    return onnxruntime_ep_webgpu.get_library_path()


def _vulkan_loader():
    """The Vulkan loader, on Linux (Dawn's only backend there); None elsewhere."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL("libvulkan.so.1")
    except OSError:
        raise WebGpuUnavailable(
            "WebGPU runs through Vulkan on Linux, and the Vulkan loader (libvulkan.so.1) is "
            "missing: install it (Debian/Ubuntu: apt install libvulkan1) with your GPU's Vulkan "
            "driver (mesa-vulkan-drivers for AMD and Intel; NVIDIA's driver and JetPack carry "
            "their own)") from None


class _InstanceInfo(ctypes.Structure):  # VkInstanceCreateInfo
    _fields_ = [("sType", ctypes.c_uint32), ("pNext", ctypes.c_void_p),
                ("flags", ctypes.c_uint32), ("pApplicationInfo", ctypes.c_void_p),
                ("enabledLayerCount", ctypes.c_uint32), ("ppEnabledLayerNames", ctypes.c_void_p),
                ("enabledExtensionCount", ctypes.c_uint32),
                ("ppEnabledExtensionNames", ctypes.c_void_p)]


def vulkan_devices(loader) -> list[tuple[int, int, str, str]]:
    """(vendor id, device id, kind, name) of each Vulkan device the loader finds; [] where it
    cannot make an instance (no driver at all)."""
    info = _InstanceInfo(sType=1)  # VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO
    instance = ctypes.c_void_p()
    if loader.vkCreateInstance(ctypes.byref(info), None, ctypes.byref(instance)) != 0:
        return []
    try:
        count = ctypes.c_uint32(0)
        loader.vkEnumeratePhysicalDevices(instance, ctypes.byref(count), None)
        handles = (ctypes.c_void_p * count.value)()
        loader.vkEnumeratePhysicalDevices(instance, ctypes.byref(count), handles)
        out = []
        for handle in handles[:count.value]:
            # VkPhysicalDeviceProperties: apiVersion, driverVersion, vendorID, deviceID,
            # deviceType (uint32 each), deviceName[256], then limits we do not read
            props = ctypes.create_string_buffer(4096)
            loader.vkGetPhysicalDeviceProperties(ctypes.c_void_p(handle), props)
            vendor, device, kind = (int.from_bytes(props.raw[o:o + 4], "little")
                                    for o in (8, 12, 16))
            name = props.raw[20:276].split(b"\0", 1)[0].decode("utf-8", "replace")
            out.append((vendor, device, _VK_TYPES.get(kind, "gpu"), name))
        return out
    finally:
        loader.vkDestroyInstance(instance, None)


@functools.lru_cache(maxsize=1)
def _registered_devices() -> tuple:
    """The provider registered once per process, and the devices it offers."""
    ort = import_onnxruntime()
    if _version(ort.__version__) < MIN_ONNXRUNTIME:
        raise WebGpuUnavailable(f"onnxruntime {ort.__version__} is too old for the WebGPU "
                                f"provider (it needs {'.'.join(map(str, MIN_ONNXRUNTIME))}): "
                                f"{INSTALL}")
    library = _plugin_library()
    # the provider's own warning that the software switch is set: the load says it once
    ort.set_default_logger_severity(3)
    try:
        ort.register_execution_provider_library("webgpu", library)
    except Exception as e:  # registered by someone else in this process: reuse it
        if "already" not in str(e).lower():
            raise WebGpuUnavailable(f"onnxruntime could not load its WebGPU provider ({e})") \
                from None
    return tuple(d for d in ort.get_ep_devices() if d.ep_name == EP_NAME)


def _kind_and_name(ep_device, software: bool, loader) -> tuple[str, str, str]:
    hw = ep_device.device
    vendor = VENDORS.get(hw.vendor_id, hw.vendor or f"vendor 0x{hw.vendor_id:04x}")
    listed = vulkan_devices(loader) if loader is not None else []
    if software:
        match = [d for d in listed if d[2] == "software"]
    else:
        match = [d for d in listed if (d[0], d[1]) == (hw.vendor_id, hw.device_id)] or \
            [d for d in listed if d[0] == hw.vendor_id and d[2] != "software"]
    if match:
        v, _, kind, name = match[0]
        return VENDORS.get(v, vendor), kind, name
    if software:
        return vendor, "software", "a software adapter"
    return vendor, "gpu", f"{vendor} GPU 0x{hw.device_id:04x}"


def _shader_f16(ep_device) -> bool:
    """Whether the adapter runs float16 arithmetic: a first run of a two-node fp16 graph (it is
    also where a broken driver shows, before any model loads)."""
    import numpy as np
    from onnx import TensorProto, helper

    ort = import_onnxruntime()
    graph = helper.make_graph(
        [helper.make_node("Cast", ["x"], ["h"], to=TensorProto.FLOAT16),
         helper.make_node("Add", ["h", "h"], ["s"]),
         helper.make_node("Cast", ["s"], ["y"], to=TensorProto.FLOAT)], "f16_probe",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    opts = ort.SessionOptions()
    opts.log_severity_level = 4  # a missing shader-f16 is an answer here, not an error to log
    opts.add_provider_for_devices([ep_device], {})
    try:
        session = ort.InferenceSession(model.SerializeToString(), opts)
        y = session.run(None, {"x": np.arange(4, dtype=np.float32)})[0]
    except Exception as e:
        if "f16" in str(e):
            return False
        raise WebGpuUnavailable(f"the WebGPU adapter failed its first run ({e})") from None
    return bool(np.array_equal(y, 2 * np.arange(4, dtype=np.float32)))


@functools.lru_cache(maxsize=2)
def find_adapter(hardware_only: bool = False) -> WebGpuAdapter:
    """The adapter the graphs run on: the first GPU the provider offers; else, where the
    provider's software switch is set and `hardware_only` is not, the software adapter.
    WebGpuUnavailable says why there is none."""
    loader = _vulkan_loader()
    devices = _registered_devices()
    gpus = [d for d in devices if d.device.type.name == "GPU"]
    soft = [d for d in devices if d.device.type.name != "GPU"]
    if gpus:
        chosen, software = gpus[0], False
    elif soft and not hardware_only:
        chosen, software = soft[0], True
    elif soft:
        raise WebGpuUnavailable("WebGPU offers only a software adapter here (the CPU through a "
                                "software Vulkan driver), which --device auto does not take: "
                                "--device webgpu runs on it")
    else:
        raise WebGpuUnavailable(
            "WebGPU found no GPU adapter (no GPU with a Vulkan, Metal or D3D12 driver); on a "
            f"machine without one, {SOFTWARE_SWITCH}=1 with a software Vulkan driver "
            "(SwiftShader) runs it on the CPU, slowly")
    vendor, kind, name = _kind_and_name(chosen, software, loader)
    return WebGpuAdapter(chosen, name, vendor, kind,
                         BACKENDS.get(sys.platform, "WebGPU"), _shader_f16(chosen))


def software_asked() -> bool:
    """Whether the provider's own switch for a software adapter is set."""
    return os.environ.get(SOFTWARE_SWITCH, "") not in ("", "0")
