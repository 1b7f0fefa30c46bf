"""Peak memory of a bench phase: the CUDA allocator's peak, or the process's resident set size sampled every
few milliseconds from /proc on the CPU (the process-wide `ru_maxrss` only ever grows, so it cannot tell
phases apart; it is reported as well)."""
from __future__ import annotations

import ctypes
import gc
import os
import resource
import sys
import threading

import torch

MiB = 1024 * 1024


def _rss_bytes() -> int | None:
    try:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def process_peak_rss_mib() -> float:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / MiB if sys.platform == "darwin" else peak / 1024   # bytes on macOS, KiB on Linux


def _release_freed_memory() -> None:
    """Collect garbage and return freed heap pages to the OS (glibc), so that a phase's RSS is not
    inflated by what an earlier phase (a baseline's 77-token backward) left behind."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


class PeakMemory:
    """Peak memory (MiB) of a phase: CUDA allocator peak, or the sampled process RSS on the CPU; `added_mib`:
    that peak over what was held when the phase began (the model, every method's state), i.e. what the
    phase's own work (activations, a tuning step's graph) needed at most."""

    def __init__(self, device: torch.device, interval: float = 0.005):
        self.device, self.interval = device, interval
        self.peak_bytes = 0
        self.start_bytes = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _sample(self) -> None:
        while not self._stop.is_set():
            self.peak_bytes = max(self.peak_bytes, _rss_bytes() or 0)
            self._stop.wait(self.interval)

    def __enter__(self) -> PeakMemory:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self.start_bytes = torch.cuda.memory_allocated(self.device)
        elif _rss_bytes() is not None:
            _release_freed_memory()
            self.peak_bytes = self.start_bytes = _rss_bytes() or 0
            self._thread = threading.Thread(target=self._sample, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self.peak_bytes = torch.cuda.max_memory_allocated(self.device)
        elif self._thread is not None:
            self._stop.set()
            self._thread.join()
            self.peak_bytes = max(self.peak_bytes, _rss_bytes() or 0)
        else:   # no /proc: the process-wide high-water mark is all there is (nothing to subtract)
            self.peak_bytes = int(process_peak_rss_mib() * MiB)

    @property
    def mib(self) -> float:
        return self.peak_bytes / MiB

    @property
    def added_mib(self) -> float | None:
        """None where only the process-wide high-water mark is known."""
        if self.device.type != "cuda" and self._thread is None:
            return None
        return max(self.peak_bytes - self.start_bytes, 0) / MiB
