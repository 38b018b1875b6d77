from __future__ import annotations

import threading

import psutil
import pytest

from workers import gpu, system_metrics


def test_sample_reads_this_process() -> None:
    process = psutil.Process()
    process.cpu_percent(interval=None)
    values = system_metrics.sample(process, gpu=None)
    assert set(values) == {"sys/cpu_percent", "sys/rss_mb", "sys/node_memory_percent"}
    assert values["sys/rss_mb"] > 10  # a Python process with torch imported is far bigger than that
    assert 0 < values["sys/node_memory_percent"] < 100


def test_sampling_thread_logs_until_stopped(monkeypatch: pytest.MonkeyPatch) -> None:
    logged: list[dict[str, float]] = []
    twice = threading.Event()

    def fake_log(values: dict[str, float], step: int | None = None) -> None:
        logged.append(values)
        if len(logged) >= 2:
            twice.set()

    monkeypatch.setattr(system_metrics.trainmaster, "log", fake_log)
    monkeypatch.setenv("TRAINMASTER_JOB_ID", "job-1")
    monkeypatch.setenv("TRAINMASTER_SYSTEM_METRICS_INTERVAL_S", "0.05")
    stop = threading.Event()
    thread = system_metrics.start(stop)
    assert thread is not None and twice.wait(5)
    stop.set()
    thread.join(2)
    assert not thread.is_alive()
    assert all("sys/cpu_percent" in values for values in logged)


def test_interval_zero_disables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRAINMASTER_JOB_ID", "job-1")
    monkeypatch.setenv("TRAINMASTER_SYSTEM_METRICS_INTERVAL_S", "0.05")
    stop = threading.Event()
    running = system_metrics.start(stop)
    assert running is not None  # the same job with a positive interval samples
    stop.set()
    monkeypatch.setenv("TRAINMASTER_SYSTEM_METRICS_INTERVAL_S", "0")
    assert system_metrics.start(threading.Event()) is None


def test_cpulist_and_numa_lookup(tmp_path) -> None:  # type: ignore[no-untyped-def]
    assert gpu.parse_cpulist("0-3,8,10-11\n") == {0, 1, 2, 3, 8, 10, 11}
    device = tmp_path / "0000:3b:00.0"
    device.mkdir()
    (device / "numa_node").write_text("1\n")
    assert gpu.numa_node_of("0000:3B:00.0", sys_pci=tmp_path) == 1
    (device / "numa_node").write_text("-1\n")
    assert gpu.numa_node_of("0000:3b:00.0", sys_pci=tmp_path) is None
