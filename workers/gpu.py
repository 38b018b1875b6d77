"""GPU placement details: which device a worker uses, its NUMA node, and CPU affinity binding."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

SYS_PCI = Path("/sys/bus/pci/devices")
SYS_NODES = Path("/sys/devices/system/node")


def parse_cpulist(text: str) -> set[int]:
    """'0-3,8,10-11' -> {0, 1, 2, 3, 8, 10, 11}"""
    cpus: set[int] = set()
    for part in text.strip().split(","):
        if not part:
            continue
        low, _, high = part.partition("-")
        cpus.update(range(int(low), int(high or low) + 1))
    return cpus


def pci_bus_id(device_index: int) -> str | None:
    import torch

    props: Any = torch.cuda.get_device_properties(device_index)
    domain = getattr(props, "pci_domain_id", None)
    bus = getattr(props, "pci_bus_id", None)
    device = getattr(props, "pci_device_id", None)
    if bus is None or device is None:
        return None
    return f"{domain or 0:04x}:{bus:02x}:{device:02x}.0"


def numa_node_of(bus_id: str, sys_pci: Path = SYS_PCI) -> int | None:
    """The NUMA node the machine reports for a PCI device, or None (-1 means: not reported)."""
    path = sys_pci / bus_id.lower() / "numa_node"
    try:
        node = int(path.read_text().strip())
    except (OSError, ValueError):
        return None
    return node if node >= 0 else None


def bind_to_numa_node(node: int, sys_nodes: Path = SYS_NODES) -> set[int] | None:
    """Restrict this process to the CPUs of `node` (those it may use already); returns them."""
    try:
        node_cpus = parse_cpulist((sys_nodes / f"node{node}" / "cpulist").read_text())
    except OSError:
        return None
    allowed = os.sched_getaffinity(0) & node_cpus
    if not allowed:
        return None
    os.sched_setaffinity(0, allowed)
    return allowed


def describe_device() -> dict[str, Any]:
    """The device this worker trains on; binds CPU affinity to the GPU's NUMA node where reported."""
    import torch

    if not torch.cuda.is_available():
        return {"device": "cpu"}
    index = torch.cuda.current_device()
    info: dict[str, Any] = {
        "device": f"cuda:{index}",
        "gpu_name": torch.cuda.get_device_name(index),
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
    }
    bus_id = pci_bus_id(index)
    if bus_id:
        info["pci_bus_id"] = bus_id
        node = numa_node_of(bus_id)
        info["numa_node"] = node
        if node is not None:
            bound = bind_to_numa_node(node)
            info["cpu_affinity"] = sorted(bound) if bound else None
    return info
