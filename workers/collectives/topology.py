"""Where a worker runs: node, GPU, NUMA node, and the node's GPU link matrix from NVML.

The matrix uses `nvidia-smi topo -m` labels: X (self), NV<k> (k NVLinks, direct or through an
NVSwitch), PIX, PXB, PHB, NODE, SYS. pynvml is optional: without it (or without a GPU driver) the
event says why the matrix is missing instead of failing the job.
"""

from __future__ import annotations

import os
import socket
from typing import Any

from workers.gpu import numa_node_of, pci_bus_id

# NVML topology levels (nvmlGpuTopologyLevel_t) -> nvidia-smi labels.
PCI_LEVELS = {0: "X", 10: "PIX", 20: "PXB", 30: "PHB", 40: "NODE", 50: "SYS"}
MAX_NVLINKS = 18


def worker_topology(rank: int, local_rank: int, node_rank: int) -> dict[str, Any]:
    """Everything the `topology` event records for this worker."""
    import ray
    import torch

    info: dict[str, Any] = {
        "rank": rank,
        "local_rank": local_rank,
        "node_rank": node_rank,
        "node_id": ray.get_runtime_context().get_node_id(),
        "node_ip": ray.util.get_node_ip_address(),
        "hostname": socket.gethostname(),
        "cpus": len(os.sched_getaffinity(0)),
        "device": "cpu",
    }
    if torch.cuda.is_available():
        index = torch.cuda.current_device()
        info.update(device=f"cuda:{index}", gpu_name=torch.cuda.get_device_name(index))
        bus_id = pci_bus_id(index)
        info["pci_bus_id"] = bus_id
        info["numa_node"] = numa_node_of(bus_id) if bus_id else None
        info.update(nvml_links())
    return info


def nvml_links() -> dict[str, Any]:
    """{"nvml_gpus": [...], "nvml_matrix": [[label]]} for every GPU of the node, or {"nvml_error": why}."""
    try:
        import pynvml
    except ImportError:
        return {"nvml_error": "pynvml is not installed (pip install nvidia-ml-py)"}
    try:
        pynvml.nvmlInit()
    except Exception as exc:
        return {"nvml_error": f"NVML unavailable: {exc}"}
    try:
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
        buses = [_text(pynvml.nvmlDeviceGetPciInfo(h).busId).lower() for h in handles]
        links = [_nvlink_peers(pynvml, h) for h in handles]
        matrix = [
            [_label(pynvml, handles, links, buses, i, j) for j in range(len(handles))] for i in range(len(handles))
        ]
        names = [_text(pynvml.nvmlDeviceGetName(h)) for h in handles]
        return {
            "nvml_gpus": [{"name": n, "pci_bus_id": b} for n, b in zip(names, buses, strict=True)],
            "nvml_matrix": matrix,
        }
    except Exception as exc:  # an NVML call this driver lacks: report, never fail the benchmark
        return {"nvml_error": f"NVML query failed: {exc}"}
    finally:
        pynvml.nvmlShutdown()


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _nvlink_peers(pynvml: Any, handle: Any) -> dict[str, int]:
    """Active NVLinks of one GPU, counted per remote PCI bus id (a GPU or an NVSwitch)."""
    peers: dict[str, int] = {}
    for link in range(MAX_NVLINKS):
        try:
            if pynvml.nvmlDeviceGetNvLinkState(handle, link) != pynvml.NVML_FEATURE_ENABLED:
                continue
            remote = _text(pynvml.nvmlDeviceGetNvLinkRemotePciInfo(handle, link).busId).lower()
        except Exception:  # no such link, or NVLink unsupported
            continue
        peers[remote] = peers.get(remote, 0) + 1
    return peers


def _label(pynvml: Any, handles: list[Any], links: list[dict[str, int]], buses: list[str], i: int, j: int) -> str:
    if i == j:
        return "X"
    direct = links[i].get(buses[j], 0)
    if direct:
        return f"NV{direct}"
    # Links to something that is not a GPU of this node go to NVSwitches, which join all GPUs.
    switched_i = sum(n for bus, n in links[i].items() if bus not in buses)
    switched_j = sum(n for bus, n in links[j].items() if bus not in buses)
    if switched_i and switched_j:
        return f"NV{min(switched_i, switched_j)}"
    level = pynvml.nvmlDeviceGetTopologyCommonAncestor(handles[i], handles[j])
    return PCI_LEVELS.get(int(level), str(level))


def describe(info: dict[str, Any]) -> str:
    where = f"rank {info['rank']} on {info['hostname']} ({info['node_ip']}, node {str(info['node_id'])[:8]})"
    if info["device"] == "cpu":
        return f"{where}: CPU, {info['cpus']} cores"
    return f"{where}: {info['device']} {info.get('gpu_name')}, NUMA node {info.get('numa_node')}"
