"""The MPI job as a whole: loading mpi4py, knowing when mpiexec launched us, and ending a failed job.

MPI cannot repair a communicator once a rank has failed, so a failure ends the
job. It should end the way a failure on thread ranks does, though: every rank
raises an error that names the rank at fault, and nobody is left hanging. A
rank that fails (an exception in its program, a collective that timed out)
sends a short *notice* to every other rank; ranks waiting in a collective see
it within a poll and raise ``CollectiveError("... rank 2 failed: ...")``.
Each failing rank prints its error, acknowledges the notices it saw, and the
ranks that sent notices wait (at most a grace period) for every other rank's
acknowledgement before calling ``MPI_Abort``, which ends every process and
makes mpiexec return non-zero. Ranks a notice names as unresponsive (they did
not arrive within the timeout) are not waited for; any other rank that never
polls (stuck in compute) is ended by that abort after the grace period.
"""

from __future__ import annotations

import atexit
import os
import pickle
import struct
import sys
import threading
import time
import weakref
from collections.abc import Callable, Sequence

from ...runtime.transfer import share_host_pool
from ..errors import CollectiveError

# Variables the common launchers set in every process they start (MPICH/Hydra and Intel MPI: PMI_*,
# Open MPI: OMPI_*, PMIx launchers such as Slurm's srun --mpi=pmix: PMIX_*, MVAPICH: MV2_*).
LAUNCH_VARS = ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "MV2_COMM_WORLD_RANK")
ABORT_GRACE = 10.0  # seconds a failing rank waits for the others to report before ending the job
_NOTICE, _ACK = 1, 2  # tags on the world's control communicator
_NOTICE_BYTES = 4096


def launched_by_mpi() -> bool:
    """Whether an MPI launcher (mpiexec, mpirun, srun) started this process."""
    return any(os.environ.get(v) for v in LAUNCH_VARS)


def load_mpi():
    """mpi4py's MPI module, initialised with full thread support (several communication threads call MPI)."""
    try:
        import mpi4py
    except ImportError as exc:
        raise ImportError("the MPI backend needs mpi4py and an MPI library: pip install 'wgpar[mpi]' "
                          "(mpi4py and MPICH from PyPI), or mpi4py built against your system's MPI") from exc
    if "mpi4py.MPI" not in sys.modules:
        mpi4py.rc.thread_level = "multiple"
    try:
        from mpi4py import MPI
    except (ImportError, RuntimeError) as exc:
        raise ImportError(f"mpi4py is installed but cannot load an MPI library ({exc}): pip install mpich, or "
                          "install your system's MPI") from exc
    if MPI.Query_thread() < MPI.THREAD_MULTIPLE:
        raise RuntimeError("the MPI backend needs MPI_THREAD_MULTIPLE (each process group has a communication "
                           f"thread); this MPI library ({MPI.Get_library_version().splitlines()[0]}) gave level "
                           f"{MPI.Query_thread()}")
    return MPI


class Interrupted(CollectiveError):
    """A wait stopped because the job is failing (a notice from another rank, or this group broke)."""


def _encode(rank: int, reason: str, unresponsive: list[int]) -> bytes:
    body = pickle.dumps((rank, reason[:_NOTICE_BYTES // 2], unresponsive[:64]))
    return struct.pack("<I", len(body)) + body


def _decode(buf: bytearray) -> tuple[int, str, list[int]]:
    (n,) = struct.unpack_from("<I", buf)
    return pickle.loads(bytes(buf[4:4 + n]))


class World:
    """This process's view of the MPI job: its world rank, its host, and the failure protocol."""

    def __init__(self) -> None:
        MPI = self.MPI = load_mpi()
        self.comm = MPI.COMM_WORLD
        self.rank, self.size = self.comm.Get_rank(), self.comm.Get_size()
        self._ctl = self.comm.Dup()
        host = self.comm.Split_type(MPI.COMM_TYPE_SHARED, key=self.rank)
        self.local_rank, self.local_size = host.Get_rank(), host.Get_size()
        host.Free()
        share_host_pool(self.local_size)  # the host's processes reduce and copy at once: each its share of cores
        self.grace = ABORT_GRACE
        self.failure: str | None = None  # why the job is failing, once it is
        self.culprit: int | None = None  # the world rank that failed first, as far as this rank knows
        self._lock = threading.Lock()
        self._buf = bytearray(_NOTICE_BYTES)
        self._listener = self._ctl.Irecv(self._buf, MPI.ANY_SOURCE, _NOTICE)
        self._noticed: list[int] = []
        self._unresponsive: set[int] = set()  # world ranks the notices name as not arriving: no ack expected
        self._acked: set[int] = set()
        self._notified = False
        self._settled = False
        self._sends: list = []
        self._groups: list = []  # weak references to every MPIGroup of this process
        self._prev_hook = sys.excepthook
        sys.excepthook = self._excepthook
        atexit.register(self._at_exit)

    def register(self, group) -> None:
        """Track a group, so that the exit handler can stop its communication thread before MPI_Finalize."""
        self._groups.append(weakref.ref(group))

    # -- failure notices ------------------------------------------------------------------
    def poll(self) -> str | None:
        """Read the failure notices that arrived; returns why the job is failing, or None."""
        with self._lock:
            while self._listener is not None and self._listener.Test():
                rank, reason, unresponsive = _decode(self._buf)
                self._noticed.append(rank)
                self._unresponsive.update(unresponsive)
                if self.failure is None:
                    self.failure, self.culprit = f"rank {rank} failed: {reason}", rank
                self._listener = self._ctl.Irecv(self._buf, self.MPI.ANY_SOURCE, _NOTICE)
            return self.failure

    def notify(self, reason: str, unresponsive: Sequence[int] = ()) -> None:
        """This rank failed: tell every other rank (once), without waiting for them. ``unresponsive``:
        world ranks that did not arrive within the timeout (nobody waits for their acknowledgement)."""
        with self._lock:
            if self.failure is None:
                self.failure, self.culprit = f"rank {self.rank} failed: {reason}", self.rank
            self._unresponsive.update(unresponsive)
            if self._notified:
                return
            self._notified = True
            msg = _encode(self.rank, reason, sorted(self._unresponsive))
            self._sends += [self._ctl.Isend(msg, r, _NOTICE) for r in range(self.size) if r != self.rank]

    def settle(self) -> None:
        """After this rank reported its failure: acknowledge the notices seen, and if this rank sent
        notices itself, wait (at most ``grace`` seconds) for every other responsive rank's
        acknowledgement, so that each can print its error before the job is aborted."""
        if self._settled:
            return
        self._settled = True
        MPI = self.MPI
        status = MPI.Status()
        ack_buf = bytearray(4)
        acks: set[int] = set()

        def waiting() -> bool:
            self.poll()
            return any(r not in acks and r not in self._unresponsive for r in range(self.size) if r != self.rank)

        ack_req = self._ctl.Irecv(ack_buf, MPI.ANY_SOURCE, _ACK) if self._notified and waiting() else None
        deadline = time.monotonic() + self.grace
        while True:
            self.poll()
            with self._lock:
                for r in self._noticed:
                    if r not in self._acked and r != self.rank:
                        self._acked.add(r)
                        self._sends.append(self._ctl.Isend(b"ack!", r, _ACK))
            while ack_req is not None and ack_req.Test(status):
                acks.add(status.Get_source())
                ack_req = self._ctl.Irecv(ack_buf, MPI.ANY_SOURCE, _ACK) if waiting() else None
            if ack_req is None and self._notified:
                return
            if time.monotonic() > deadline:
                return
            time.sleep(0.002)

    def abort_job(self, code: int = 1) -> None:
        """End every process of the job (mpiexec returns non-zero)."""
        for f in (sys.stdout, sys.stderr):
            try:
                f.flush()
            except Exception:  # a closed stream must not keep the job alive
                pass
        self.comm.Abort(code)

    def _excepthook(self, etype, value, tb) -> None:
        # An exception nobody caught in the main thread of an MPI rank: report it, then end the job
        # (plain ``python script.py`` would otherwise hang in MPI_Finalize while the others wait).
        self._prev_hook(etype, value, tb)
        self.poll()
        if self.failure is None or self.culprit == self.rank:
            self.notify(f"{etype.__name__}: {value}")
        self.settle()
        self.abort_job()

    def _at_exit(self) -> None:
        if self.poll() is None:
            # No thread may call MPI after MPI_Finalize, and a send still in flight would keep it waiting.
            for ref in self._groups:
                group = ref()
                try:
                    if group is not None:
                        group.quiesce()
                except CollectiveError:  # the job failed meanwhile: abort below
                    break
        if self.poll() is not None:  # a failed job must not reach MPI_Finalize (it could hang there)
            if not self._settled:
                print(f"wgpar: rank {self.rank} of {self.size} exits after a failure: {self.failure}", file=sys.stderr)
            self.settle()
            self.abort_job()
            return
        with self._lock:
            if self._listener is not None:
                self._listener.Cancel()
                self._listener.Wait()
                self._listener = None

    # -- waiting --------------------------------------------------------------------------
    def wait(self, requests: Sequence, timeout: float, broken: Callable[[], str | None], spin: float = 0.002,
             max_pause: float = 0.001) -> bool:
        """Poll ``requests`` until all complete (True) or ``timeout`` seconds pass (False). Raises
        Interrupted as soon as ``broken()`` or a failure notice says the job is failing.

        For the first ``spin`` seconds it polls without sleeping (yielding the GIL each time): MPI's
        non-blocking operations advance only while some thread calls into MPI, and a partner is
        usually microseconds away. Then it backs off to sleeps of up to ``max_pause`` seconds.
        """
        reqs = list(requests)
        now = time.monotonic()
        deadline, spin_until, next_check = now + timeout, now + spin, now
        pause = 2e-5
        Testall = self.MPI.Request.Testall
        while not Testall(reqs):
            now = time.monotonic()
            if now >= next_check:
                why = broken() or self.poll()
                if why:
                    raise Interrupted(why)
                if now > deadline:
                    return False
                next_check = now + 0.001
            if now < spin_until:
                time.sleep(0)
            else:
                time.sleep(pause)
                pause = min(pause * 1.5, max_pause)
        return True


_world: World | None = None
_world_lock = threading.Lock()


def world() -> World:
    """The process's World, made (and MPI initialised) on first use."""
    global _world
    with _world_lock:
        if _world is None:
            _world = World()
        return _world
