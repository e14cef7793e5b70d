"""Finding GPUs: NVML on this host, or a declared inventory file where there is no NVML."""

import dataclasses
from pathlib import Path

import yaml


class NvmlUnavailable(RuntimeError):
    """No NVIDIA driver/NVML on this host (a laptop, a CI machine, a CPU-only server)."""


@dataclasses.dataclass(frozen=True)
class DiscoveredGpu:
    index: int
    model_name: str
    memory_mib: int
    uuid: str = ""


@dataclasses.dataclass(frozen=True)
class DiscoveredNode:
    name: str
    gpus: tuple[DiscoveredGpu, ...]


def discover_local_gpus() -> list[DiscoveredGpu]:
    """Read this host's GPUs through NVML (the `nvidia-ml-py` package)."""
    import pynvml

    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as error:
        raise NvmlUnavailable(f"NVML is not available on this host ({error}).") from error
    try:
        found = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            name = pynvml.nvmlDeviceGetName(handle)
            uuid = pynvml.nvmlDeviceGetUUID(handle)
            memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
            found.append(
                DiscoveredGpu(
                    index=index,
                    model_name=name.decode() if isinstance(name, bytes) else name,
                    memory_mib=int(memory.total) // (1024 * 1024),
                    uuid=uuid.decode() if isinstance(uuid, bytes) else uuid,
                )
            )
        return found
    finally:
        pynvml.nvmlShutdown()


class InventoryError(ValueError):
    pass


def load_inventory(path: Path) -> list[DiscoveredNode]:
    """Parse a YAML inventory:

        nodes:
          - name: gpu-a
            gpus:
              - {index: 0, model: "NVIDIA A100-SXM4-80GB", memory_mib: 81920, uuid: "GPU-..."}
    """
    try:
        document = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as error:
        raise InventoryError(f"cannot read inventory {path}: {error}") from error
    if not isinstance(document, dict) or not isinstance(document.get("nodes"), list):
        raise InventoryError(f"{path}: expected a mapping with a `nodes` list")
    nodes = []
    for position, node in enumerate(document["nodes"]):
        where = f"{path}: nodes[{position}]"
        if not isinstance(node, dict) or not isinstance(node.get("name"), str) or not node["name"]:
            raise InventoryError(f"{where}: needs a `name`")
        gpus = []
        for gpu_position, gpu in enumerate(node.get("gpus") or []):
            gpu_where = f"{where}.gpus[{gpu_position}]"
            if not isinstance(gpu, dict):
                raise InventoryError(f"{gpu_where}: expected a mapping")
            try:
                gpus.append(
                    DiscoveredGpu(
                        index=int(gpu["index"]),
                        model_name=str(gpu["model"]),
                        memory_mib=int(gpu["memory_mib"]),
                        uuid=str(gpu.get("uuid") or ""),
                    )
                )
            except (KeyError, TypeError, ValueError) as error:
                raise InventoryError(f"{gpu_where}: needs index, model and memory_mib ({error})") from error
        nodes.append(DiscoveredNode(name=node["name"], gpus=tuple(gpus)))
    return nodes
