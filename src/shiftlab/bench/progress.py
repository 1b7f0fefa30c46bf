"""A heartbeat for long silent phases: `shiftlab bench` says what it is doing at least every few seconds.

A bench phase (importing torch, a prompt tuner's pass over 200 classes on a CPU) can last a minute
without a line; a silent terminal reads as a hang. `Heartbeat` keeps the time of the last line said
and the phase under way; `tick(now)` says "... <phase> (N s)" once `every` seconds (SPEAK_AFTER, 4)
passed without a line, so that lines come at least every EVERY (5) seconds. The ticking thread
(`start`/`stop`) only calls `tick`: the cadence is decided by `tick` alone, and tested by calling it
with a made-up clock. No torch here: the command starts the heartbeat before it imports torch.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable

EVERY = 5.0   # seconds: the longest silence promised (issue 34: "a progress line at least every 5 s")
# when the heartbeat speaks: 1 s before the promise, since a loaded machine delays the ticking thread (an
# import holding the GIL, a busy core): measured on 2 cores at load 8, lines came up to 1.2 s after their tick
SPEAK_AFTER = 4.0


class Heartbeat:
    def __init__(self, say: Callable[[str], None], clock: Callable[[], float] = time.monotonic,
                 every: float = SPEAK_AFTER):
        self._say, self.clock, self.every = say, clock, every
        self._lock = threading.Lock()
        now = clock()
        self.last = now                 # when the last line was said
        self.what, self.since = "starting", now
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def say(self, line: str) -> None:
        """Print a line (any progress line of the bench goes through here, so it resets the silence)."""
        with self._lock:
            self._say(line)
            self.last = self.clock()

    def phase(self, what: str) -> None:
        """The phase under way from now on (said only if it lasts)."""
        with self._lock:
            self.what, self.since = what, self.clock()

    def tick(self, now: float | None = None) -> bool:
        """Say "... still <phase>" if `every` seconds passed since the last line; whether it did."""
        with self._lock:
            now = self.clock() if now is None else now
            if now - self.last < self.every:
                return False
            self._say(f"  ... {self.what} ({now - self.since:.0f} s)")
            self.last = now
            return True

    # -- the thread -----------------------------------------------------------------------------------
    def start(self) -> Heartbeat:
        # ticks 10x per period, so a line is at most every/10 late
        def loop() -> None:
            while not self._stop.wait(self.every / 10):
                self.tick()
        self._thread = threading.Thread(target=loop, name="shiftlab-bench-heartbeat", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def __enter__(self) -> Heartbeat:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
