"""Launching SPMD work: ``run_spmd``, ``init_process_group``, and the persistent rank threads.

SPMD (single program, multiple data): the same function runs on every rank,
written against that rank's ProcessGroup (its rank, its device, its
collectives), so it runs unchanged as threads of one process or as processes
under MPI. The backend follows from how the program was started: under an MPI
launcher (mpiexec, mpirun, srun) each process is one rank ("mpi"), otherwise
the ranks are threads of this process ("threads").

With threads, ``RankWorkers.run`` hands rank r's function to thread r
(persistent, so thread-local autograd tapes stay put) and waits for all of
them. If a rank raises, the group is aborted at once, so ranks blocked in a
collective raise too instead of waiting for their timeout; ``run`` then
raises a RankError naming the first failing rank. Under MPI, ``run_spmd``
runs the function in this process and the MPI backend's failure protocol
does the same across processes, then ends the job.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

from ..runtime import adapters as _adapters
from .backends.mpi_world import launched_by_mpi
from .backends.threads import ThreadGroup
from .group import DEFAULT_TIMEOUT, ProcessGroup

BACKENDS = ("threads", "mpi")


def default_backend() -> str:
    """"mpi" when an MPI launcher started this process, else "threads"."""
    return "mpi" if launched_by_mpi() else "threads"


def _backend(backend: str | None, what: str) -> str:
    name = default_backend() if backend is None else backend
    if name not in BACKENDS:
        raise ValueError(f"{what}: unknown backend {backend!r}; available: {', '.join(BACKENDS)}")
    return name


def init_process_group(backend: str | None = None, *, timeout: float | None = None,
                       device=None) -> ProcessGroup:
    """This process's ProcessGroup, for programs that launch themselves one process per rank.

    Under mpiexec (``backend=None`` or "mpi") it is this process's rank of the job, on its own
    device (device ``local_rank``, opened for it: docs/design.md); the first call sets MPI up and later
    calls return the same group. Without an MPI launcher (or with "threads") it is a group of
    one rank on ``device`` (default device 0; later calls return the same group), so the same
    script also runs on one device; several thread ranks come from ``run_spmd``.

    Arguments:
        backend: None (from the launch), "mpi" or "threads".
        timeout: seconds every collective wait may take (default 300).
        device: this process's device (a Device or an index).
    """
    name = _backend(backend, "init_process_group")
    if name == "mpi":
        from .backends import mpi

        return mpi.init_world_group(timeout, device)
    dev = _adapters.resolve(device)
    with _single_lock:
        group = _single.get(dev)
        if group is None:
            group = _single[dev] = ThreadGroup([dev], timeout if timeout is not None else DEFAULT_TIMEOUT)
        elif timeout is not None:
            group.timeout = timeout
    return group.rank(0)


_single: dict = {}  # device -> the one-rank ThreadGroup init_process_group gave for it
_single_lock = threading.Lock()


def run_spmd(fn: Callable[..., Any], world_size: int | None = None, *, devices: Sequence | None = None,
             backend: str | None = None, timeout: float | None = None, args: Sequence = ()) -> list[Any]:
    """Run ``fn(group, *args)`` on every rank and return the results in rank order.

    Arguments:
        fn: the per-rank program; ``group`` is that rank's ProcessGroup (``group.rank``,
            ``group.device``, the collectives).
        world_size: number of ranks (threads: ``wgpar.devices(world_size)``, default every adapter;
            MPI: must equal the number of processes mpiexec started, if given).
        devices: explicit devices (or indices) instead of ``world_size`` (threads only).
        backend: None (MPI when an MPI launcher started this process, else threads), "threads" (one
            thread per rank in this process) or "mpi" (this process is one rank; results travel
            between processes pickled, so return numbers or NumPy arrays).
        timeout: seconds every collective wait may take (default 300).
    If a rank raises, every rank stops within the timeout and RankError names the rank. Under MPI
    each rank prints its error first, and the job then ends with a non-zero exit status.
    """
    name = _backend(backend, "run_spmd")
    if name == "mpi":
        if devices is not None:
            raise ValueError("run_spmd: under MPI each process picks its own device (its local rank, or "
                             "WGPAR_ADAPTER); use init_process_group(device=...) to choose one")
        from .backends import mpi

        return mpi.run_spmd(fn, world_size, timeout, args)
    from .single_controller.context import MultiAdapterContext

    kw = {} if timeout is None else {"timeout": timeout}
    with MultiAdapterContext(world_size, devices=devices, **kw) as ctx:
        return ctx.run(lambda r: fn(ctx.comm(r), *args))
