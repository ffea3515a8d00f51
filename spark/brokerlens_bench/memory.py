"""Peak memory per stage: RSS of the driver JVM, the Python driver and Spark's Python workers,
and the JVM's heap in use (all sampled by a thread), and its old generation's peak from its
memory pool MXBeans."""

from __future__ import annotations

import threading
from collections.abc import Callable

import psutil

from brokerlens.platform.jvm import collect_garbage, heap_pools


class MemorySampler:
    """Peak RSS of this process, of the driver JVM and of Spark's Python workers, and the peak of
    ``heap_used`` (bytes: the JVM's heap in use).

    A daemon thread samples the process tree every ``interval`` seconds; ``reset`` starts a
    new stage. Workers are summed per sample (their peak together, not each one's).
    """

    def __init__(self, heap_used: Callable[[], int], interval: float = 0.1):
        self.interval = interval
        self.heap_used = heap_used
        self.me = psutil.Process()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self.reset()
        self._thread = threading.Thread(target=self._run, name="bench-memory", daemon=True)
        self._thread.start()

    def reset(self) -> None:
        with getattr(self, "_lock", threading.Lock()):
            self.peak = {"python_driver_rss_mb": 0.0, "jvm_rss_mb": 0.0, "python_workers_rss_mb": 0.0, "jvm_heap_peak_mb": 0.0}

    def _sample(self) -> None:
        driver = self.me.memory_info().rss
        jvm = workers = 0
        for proc in self.me.children(recursive=True):
            try:
                name = proc.name()
                rss = proc.memory_info().rss
                if name == "java":
                    jvm += rss
                elif name.startswith("python"):
                    workers += rss
            except psutil.Error:
                continue  # a worker that just exited
        mb = 1 / 2**20
        values = [("python_driver_rss_mb", driver), ("jvm_rss_mb", jvm), ("python_workers_rss_mb", workers), ("jvm_heap_peak_mb", self.heap_used())]
        with self._lock:
            for key, value in values:
                self.peak[key] = max(self.peak[key], round(value * mb, 1))

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self._sample()

    def snapshot(self) -> dict[str, float]:
        self._sample()
        with self._lock:
            return dict(self.peak)

    def close(self) -> None:
        self._stop.set()
        self._thread.join()


def reset_heap_peak(spark) -> None:
    collect_garbage(spark)
    for pool in heap_pools(spark):
        pool.resetPeakUsage()


def old_gen_peak_mb(spark) -> dict[str, float]:
    """The old generation's peak since the last reset: what survived young collections (retained
    memory)."""
    old = sum(pool.getPeakUsage().getUsed() for pool in heap_pools(spark) if "Old" in str(pool.getName()) or "Tenured" in str(pool.getName()))
    return {"jvm_old_gen_peak_mb": round(old / 2**20, 1)}
