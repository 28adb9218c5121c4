"""The MPI backend's sends in flight, kept moving by a thread of their own.

A message moves only while its processes call MPI. Where MPI has no single-copy path between the
processes of a host (MPICH without CMA, which it turns off under ptrace_scope restrictions; Open
MPI's shared memory without CMA, KNEM or XPMEM) a large message crosses a fragment per progress call
on each side. The group's communication thread cannot be that caller: it spends its time in waits
that do not call MPI (a readback's map, an upload buffer, the next collective's GPU copy), or idles.
Measured on the 2-core lavapipe machine with CMA off: a 2 MiB send took 290 ms to reach a waiting
receiver while the sender's communication thread looked at it once a millisecond, and arrived only
after the sender's next wait ended while that thread waited for a map. So every send handed to MPI
goes to a ``SendPump``, whose thread tests the outstanding requests every ``pause`` seconds until the
receivers took them, and gives each send's staging buffers back then. (Inside a host most messages
take the shared-memory mailbox instead, shm.Mailbox, and MPI carries only their headers: the pump
serves those headers, messages between hosts, and messages that do not fit a free slot.)
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence

log = logging.getLogger("wgpar")

# Seconds between two looks at a message in flight (sleep(0) in a loop would keep taking the GIL from the thread
# that records the next kernels: each wgpu call releases it).
PAUSE_IN_FLIGHT = 0.00002


class SendPump:
    """Sends handed to MPI and not yet taken by their receivers: (requests, release) pairs, where
    ``release()`` gives the send's staging buffers back once every request completed.

    Arguments:
        testall: MPI's ``Request.Testall``.
        name: the thread's name.
        pause: seconds between two looks while any send is in flight.
    """

    def __init__(self, testall: Callable[[list], bool], name: str, pause: float = PAUSE_IN_FLIGHT) -> None:
        self._testall = testall
        self._name = name
        self._pause = pause
        self._cv = threading.Condition()
        self._sends: list[tuple[list, Callable[[], None]]] = []
        self._thread: threading.Thread | None = None
        self._stop = False
        self.completed = 0  # sends taken by their receivers (tests)

    def add(self, requests: Sequence, release: Callable[[], None]) -> None:
        """Hand over a send's requests: from now on only the pump's thread tests them."""
        with self._cv:
            if self._stop:
                raise RuntimeError(f"{self._name}: a send was handed over after the pump stopped")
            self._sends.append((list(requests), release))
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name=self._name, daemon=True)
                self._thread.start()
            self._cv.notify()

    @property
    def pending(self) -> int:
        with self._cv:
            return len(self._sends)

    def stop(self) -> list[list]:
        """Stop the thread; returns the requests of every send still in flight (now the caller's)."""
        with self._cv:
            self._stop = True
            self._cv.notify()
            thread = self._thread
        if thread is not None:
            thread.join(5)
        with self._cv:
            return [reqs for reqs, _ in self._sends]

    def _loop(self) -> None:
        while True:
            with self._cv:
                while not self._sends and not self._stop:
                    self._cv.wait()
                if self._stop:
                    return
                batch = list(self._sends)
            done = [item for item in batch if self._testall(item[0])]
            if done:
                with self._cv:
                    self._sends = [item for item in self._sends if all(item is not d for d in done)]
                    self.completed += len(done)
                for _, release in done:
                    try:
                        release()
                    except Exception:  # noqa: BLE001  (the pump must keep driving the other sends)
                        log.exception("%s: giving a taken send's staging buffers back failed", self._name)
            time.sleep(self._pause)
