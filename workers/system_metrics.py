"""System metrics of each worker, sampled in a daemon thread and sent like any other metric.

CPU % and resident memory of the worker process, the node's memory use, and for GPU workers the
device's utilisation and memory through NVML (when nvidia-ml-py is installed).
Interval: the `system_metrics_interval_s` setting, passed to every job (default 5 s; 0 turns sampling off).
"""

from __future__ import annotations

import threading
from typing import Any

import psutil

import trainmaster
from trainmaster.context import JobContext
from workers.gpu import pci_bus_id


def _nvml_handle() -> Any:
    """This worker's GPU in NVML, found by PCI bus id (NVML and CUDA may number devices differently)."""
    try:
        import pynvml
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    try:
        pynvml.nvmlInit()
        bus_id = pci_bus_id(torch.cuda.current_device())
        if bus_id is None:
            return pynvml.nvmlDeviceGetHandleByIndex(torch.cuda.current_device())
        return pynvml.nvmlDeviceGetHandleByPciBusId(bus_id)
    except Exception:  # NVML missing or refusing: GPU sampling is best effort
        return None


def sample(process: psutil.Process, gpu: Any) -> dict[str, float]:
    values = {
        "sys/cpu_percent": process.cpu_percent(interval=None),
        "sys/rss_mb": process.memory_info().rss / 2**20,
        "sys/node_memory_percent": psutil.virtual_memory().percent,
    }
    if gpu is not None:
        import pynvml

        try:
            values["sys/gpu_util_percent"] = float(pynvml.nvmlDeviceGetUtilizationRates(gpu).gpu)
            values["sys/gpu_memory_mb"] = pynvml.nvmlDeviceGetMemoryInfo(gpu).used / 2**20
        except pynvml.NVMLError:
            pass
    return values


def start(stop: threading.Event) -> threading.Thread | None:
    context = JobContext.from_env()
    if context is None or context.system_metrics_interval_s <= 0:
        return None  # outside a job there is nowhere to send samples
    interval = context.system_metrics_interval_s
    process = psutil.Process()
    process.cpu_percent(interval=None)  # the first reading only sets the baseline
    gpu = _nvml_handle()

    def run() -> None:
        while not stop.wait(interval):
            trainmaster.log(sample(process, gpu))

    thread = threading.Thread(target=run, name="trainmaster-system-metrics", daemon=True)
    thread.start()
    return thread
