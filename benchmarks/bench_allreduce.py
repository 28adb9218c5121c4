"""All-reduce time and bandwidth across devices, next to a copy-only floor measured in the same run.

The floor moves the same bytes the same way on every rank at once (device -> mapped staging buffer
-> host copy into a mapped upload buffer -> device) with no exchange and no reduction; the
all-reduce adds the two rendezvous and the host reduction (each rank reduces its slice, reading every
rank's mapped readback in place and writing every rank's upload buffer). Target: all-reduce at most 1.5x the floor.
Bandwidth is bytes reduced per second (the tensor's size divided by the time).

    python benchmarks/bench_allreduce.py --devices 2 --sizes-mb 1 4 16 64 256 1024 --repeat 3

With ``--backend mpi`` (under mpiexec, one process per device) it times the MPI backend's all-reduce
across the processes, next to the threaded backend on the same devices (run by rank 0's process while
the others wait), MPI's own Allreduce of host arrays of the same size over the same processes, and,
when the processes span several hosts, the leaders' step against MPI's own Iallreduce among the host
leaders of the same bytes (two comparisons, see below). It also reports the shared-memory reduction's bandwidth
(on host arrays) next to a host memcpy of the same bytes in every process at once, and with ``--profile``
the per-phase breakdown of one all-reduce. Tensors larger than the device's largest storage binding
(lavapipe: 128 MiB) are all-reduced as several tensors at once. Targets: processes within 1.1x of
threads inside one host; the shared-memory reduction at least 0.7x memcpy; the leaders' step
within 1.3x of MPI's Iallreduce among the leaders.

Across hosts the leaders' MPI step of chunk i runs while the host works on chunks i + 1 and i - 1
(``MPIGroup._reduce_hosts``), so its own duration says little. The table reports:

- "leaders' exposed step ms": per all-reduce, the time a leader's communication thread spent in the
  leaders' step that no host work hid (``MPIGroup.inter_host_seconds``: its Iallreduce calls, and its
  waits for them once the step's host tasks were done; the least over the leaders, as the leader that
  arrives last waits least for the others), next to "leaders' step in flight ms" (from each start
  to the test that saw it complete, summed over chunks: ``inter_host_flight_seconds``), against "MPI
  Iallreduce among leaders ms" (started and waited for at once, the same bytes, host arrays).
- The all-reduce's whole time on the hosts ("processes ms") against the one-host all-reduce on each
  host's own ranks (every host at once, a sub-group per host) plus MPI's Iallreduce among the leaders:
  their sum is what the unpipelined order of the steps would cost; below 1 the steps overlap.

    mpiexec -n 2 python benchmarks/bench_allreduce.py --backend mpi --sizes-mb 1 4 16 64 256 1024 --profile
    WGPAR_MPI_RANKS_PER_HOST=2 mpiexec -n 4 python benchmarks/bench_allreduce.py --backend mpi  # two "hosts"
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

import wgpar  # noqa: E402
from benchmarks import _report, _spmd  # noqa: E402
from wgpar.distributed import MultiAdapterContext, split_sizes  # noqa: E402
from wgpar.distributed.backends.hostreduce import copy_into  # noqa: E402
from wgpar.runtime.config import CONFIG  # noqa: E402
from wgpar.runtime.transfer import StagingBuffer, UploadBuffer  # noqa: E402


def timed(ctx: MultiAdapterContext, fn, repeat: int) -> float:
    """Median seconds of ``fn(rank)`` run on every rank at once, the GPUs drained at the end."""
    def work(r):
        fn(r)
        ctx.devices[r].synchronize()

    ctx.run(work)  # warm-up: staging buffers and pipelines
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        ctx.run(work)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def measure(ctx: MultiAdapterContext, mb: float, repeat: int) -> list[str]:
    """One table row: all-reduce and floor of ``mb`` MiB of float32 per rank."""
    n = int(mb * 2**20) // 4
    tensors = [wgpar.tensor(np.full(n, r + 1, np.float32), device=d) for r, d in enumerate(ctx.devices)]
    comms = [ctx.comm(r) for r in range(ctx.world_size)]
    nbytes = n * 4
    t_ar = timed(ctx, lambda r: comms[r].all_reduce(tensors[r], "sum"), repeat)
    downs = [StagingBuffer(d, nbytes, "floor") for d in ctx.devices]
    ups = [UploadBuffer(d, nbytes, "floor") for d in ctx.devices]

    def floor(r: int) -> None:  # the same copies, without the exchange and the reduction
        buf = tensors[r]._storage.buffer
        downs[r].start(buf, 0, nbytes)
        src = np.frombuffer(downs[r].view(600), np.float32)
        copy_into(np.frombuffer(ups[r].view(600), np.float32), src)
        del src
        downs[r].release()
        ups[r].commit(buf, 0, nbytes)

    t_floor = timed(ctx, floor, repeat)
    row = [f"{nbytes / 2**20:g}", f"{t_ar * 1e3:.2f}", f"{nbytes / t_ar / 1e9:.2f}",
           f"{t_floor * 1e3:.2f}", f"{nbytes / t_floor / 1e9:.2f}", f"{t_ar / t_floor:.2f}"]
    print(" | ".join(row), flush=True)
    return row


def timed_mpi(group, fn, repeat: int, gpu: bool = True) -> float:
    """Median seconds of ``fn()`` run by every process at once (the GPU drained when ``gpu``), as rank 0
    sees it."""
    from mpi4py import MPI

    def run() -> None:
        fn()
        if gpu:
            group.device.synchronize()

    run()  # warm-up
    times = []
    for _ in range(repeat):
        MPI.COMM_WORLD.Barrier()
        t0 = time.perf_counter()
        run()
        MPI.COMM_WORLD.Barrier()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


# The phases of one all-reduce, as the profiler records them (wgpar.runtime.profiling spans).
# "host step": the MPI backend's pipelined step inside one host (a chunk's reduction, the previous chunk's
# copy out of shared memory and the next one's copy in, at once on the host pool); the copies in and out
# outside the steps are the first chunk's and the last one's. Across hosts a step reduces chunk i, copies
# chunk i - 2 out and (on a leader) tests the leaders' step of chunk i - 1; "leaders' step" is a leader's
# wait for it once the step's tasks were done (the part no host work hid).
PHASES = ("device -> staging", "map wait", "header exchange", "copy into shared memory", "host barrier",
          "host step", "host reduce", "copy out of shared memory", "leaders' step", "rendezvous",
          "host copy", "upload buffer wait", "staging -> device")


def pieces(nbytes: int, device) -> list[int]:
    """Element counts of the float32 tensors that make up ``nbytes`` (several where one tensor would
    exceed the device's largest storage binding, as on lavapipe's 128 MiB)."""
    return split_sizes(nbytes // 4, -(-nbytes // device.max_binding))


def all_reduce_all(comm, tensors) -> None:
    works = [comm.all_reduce(t, "sum", async_op=True) for t in tensors]
    for w in works:
        w.wait()


def phase_times(fn, repeat: int, sync) -> dict[str, float]:
    """Seconds per call of each profiled phase of ``fn()`` (summed over its calls and threads)."""
    out: dict[str, float] = {}
    with wgpar.profiler.profile() as prof:
        for _ in range(repeat):
            fn()
            sync()
    for e in prof.ranges():
        if e.name in PHASES:
            out[e.name] = out.get(e.name, 0.0) + e.dur / 1e9 / repeat
    return out


def memcpy_time(group, nbytes: int, repeat: int) -> tuple[float, float]:
    """Median seconds for every process to copy ``nbytes`` between host arrays at once: on the host pool
    (the same parallelism as the shared-memory reduction: the reference of the target), and as one
    ``np.copyto`` on one thread."""
    src, dst = np.ones(nbytes, np.uint8), np.zeros(nbytes, np.uint8)
    pooled = timed_mpi(group, lambda: copy_into(dst, src, block=4 << 20), repeat, gpu=False)
    return pooled, timed_mpi(group, lambda: np.copyto(dst, src), repeat, gpu=False)


def measure_mpi(group, mb: float, repeat: int, profile: bool, hostgroup=None) -> tuple[list[str], dict]:
    """One row: the MPI backend's all-reduce, the threaded backend's on the same devices (rank 0's
    process), MPI's own Allreduce of host arrays, and a host memcpy of the same bytes; across hosts
    (``hostgroup``: this process's host, a sub-group), also the leaders' MPI step and the one-host
    all-reduce. The second value is the per-phase breakdown (rank 0's view)."""
    from mpi4py import MPI

    nbytes = int(mb * 2**20) // 4 * 4
    world = group.world_size
    sizes = pieces(nbytes, group.device)
    ts = [wgpar.tensor(np.full(n, group.rank + 1, np.float32), device=group.device) for n in sizes]
    t_proc = timed_mpi(group, lambda: all_reduce_all(group, ts), repeat)
    phases = {"processes": MPI.COMM_WORLD.gather(phase_times(lambda: all_reduce_all(group, ts), max(1, repeat),
                                                             group.device.synchronize) if profile else {})}
    t_copy, t_copy1 = memcpy_time(group, nbytes, repeat)
    host = np.full(nbytes // 4, 1, np.float32)
    # The shared-memory reduction alone: the same path on host arrays (no device copies).
    shm = timed_mpi(group, lambda: group.host_all_reduce(host, "sum"), repeat, gpu=False)
    host.fill(1)
    t_mpi = timed_mpi(group, lambda: MPI.COMM_WORLD.Allreduce(MPI.IN_PLACE, host, MPI.SUM), repeat, gpu=False)
    row = [f"{nbytes / 2**20:g}", f"{t_proc * 1e3:.2f}", f"{nbytes / t_proc / 1e9:.2f}"]
    t_thr = float("nan")
    if group.rank == 0:  # the threaded backend on the same devices, in this process; the others wait
        ctx = MultiAdapterContext(world, timeout=600)
        tts = [[wgpar.tensor(np.full(n, r + 1, np.float32), device=d) for n in sizes]
               for r, d in enumerate(ctx.devices)]
        t_thr = timed(ctx, lambda r: all_reduce_all(ctx.comm(r), tts[r]), repeat)
        if profile:
            phases["threads"] = phase_times(lambda: ctx.run(lambda r: all_reduce_all(ctx.comm(r), tts[r])),
                                            max(1, repeat), lambda: [d.synchronize() for d in ctx.devices])
        del tts
        ctx.close()
        wgpar.empty_cache()
    group.barrier()  # polls with sleeps: the waiting processes leave the cores to rank 0's threads
    row += [f"{t_thr * 1e3:.2f}", f"{nbytes / t_thr / 1e9:.2f}", f"{t_proc / t_thr:.2f}",
            f"{nbytes / shm / 1e9:.2f}", f"{nbytes / t_copy / 1e9:.2f}", f"{t_copy / shm:.2f}",
            f"{nbytes / t_copy1 / 1e9:.2f}",
            f"{t_mpi * 1e3:.2f}", f"{nbytes / t_mpi / 1e9:.2f}"]
    if hostgroup is not None:  # the leaders' step inside the all-reduce vs MPI's Iallreduce among the leaders
        leaders = group.leaders
        t_lead = 0.0
        if leaders != MPI.COMM_NULL:
            leaders.Iallreduce(MPI.IN_PLACE, host, MPI.SUM).Wait()
            leaders.Barrier()
            t0 = time.perf_counter()
            for _ in range(repeat):
                leaders.Iallreduce(MPI.IN_PLACE, host, MPI.SUM).Wait()
            t_lead = (time.perf_counter() - t0) / repeat
        group.inter_host_seconds = group.inter_host_flight_seconds = 0.0
        for _ in range(repeat):
            all_reduce_all(group, ts)
        group.device.synchronize()
        # The leader that arrives last at each step waits least for the others: its time is the transfer's.
        step, flight = 0.0, 0.0
        if leaders != MPI.COMM_NULL:
            step = leaders.allreduce(group.inter_host_seconds, op=MPI.MIN) / repeat
            flight = leaders.allreduce(group.inter_host_flight_seconds, op=MPI.MIN) / repeat
        step, flight = MPI.COMM_WORLD.bcast((step, flight), root=0)
        t_lead = MPI.COMM_WORLD.allreduce(t_lead, op=MPI.MAX)
        # The same all-reduce inside each host alone (every host at once, on sub-groups of one host each).
        hts = [wgpar.tensor(np.full(n, group.rank + 1, np.float32), device=group.device) for n in sizes]
        t_host = timed_mpi(group, lambda: all_reduce_all(hostgroup, hts), repeat)
        del hts
        row += [f"{t_lead * 1e3:.2f}", f"{step * 1e3:.2f}", f"{flight * 1e3:.2f}", f"{step / t_lead:.2f}",
                f"{t_host * 1e3:.2f}", f"{t_proc / (t_host + t_lead):.2f}"]
    if group.rank == 0:
        print(" | ".join(row), flush=True)
    return row, phases


def phase_table(mb: float, phases: dict) -> str:
    """Milliseconds per all-reduce in each phase: every process, and the threaded backend (both ranks'
    threads summed: its phases run on the two ranks at once)."""
    cols = [f"process {r}" for r in range(len(phases["processes"]))] + (["threads (both ranks)"]
                                                                           if "threads" in phases else [])
    data = phases["processes"] + ([phases["threads"]] if "threads" in phases else [])
    rows = [[k] + [f"{d.get(k, 0.0) * 1e3:.2f}" for d in data] for k in PHASES if any(k in d for d in data)]
    return f"Phases of one all-reduce of {mb:g} MiB (ms, summed over threads):\n\n" + \
        _report.markdown_table(["phase", *cols], rows) + "\n"


def main_mpi(args) -> None:
    from wgpar.distributed import init_process_group

    group = init_process_group("mpi", timeout=600)
    devs = group.gather_objects(_report.device_line(group.device))
    hostgroup = None
    for h in range(group.num_hosts if group.num_hosts > 1 else 0):  # every rank takes part in every split
        sub = group.split([r for r in range(group.world_size) if group.hosts[r] == h])
        hostgroup = sub if sub is not None else hostgroup
    rows, tables = [], []
    for mb in args.sizes_mb:
        row, phases = measure_mpi(group, mb, args.repeat, args.profile, hostgroup)
        rows.append(row)
        if args.profile and group.rank == 0:
            tables.append(phase_table(mb, phases))
            print(tables[-1], flush=True)
        wgpar.empty_cache()
    if group.rank != 0:
        return
    header = ["MiB", "processes ms", "processes GB/s", "threads ms", "threads GB/s",
              "processes / threads (target <= 1.1)", "shm reduction GB/s", "host memcpy GB/s",
              "shm reduction / memcpy (target >= 0.7)", "memcpy on one thread GB/s", "MPI Allreduce (host) ms",
              "MPI Allreduce GB/s"]
    hosts = ""
    if group.num_hosts > 1:
        header += ["MPI Iallreduce among leaders ms", "leaders' exposed step ms", "leaders' step in flight ms",
                   "exposed / Iallreduce (target <= 1.3)", "one-host all-reduce ms",
                   "processes / (one host + Iallreduce)"]
        hosts = f" on {group.num_hosts} hosts" + (" (simulated: WGPAR_MPI_RANKS_PER_HOST)" if CONFIG.mpi_ranks_per_host
                                                  else "")
    table = _report.markdown_table(header, rows)
    name = group.device.adapter_name
    cmd = _report.mpi_command_line(group.world_size)
    body = (f"### All-reduce on {group.world_size} MPI processes{hosts}: {name}\n\n"
            f"Devices: {', '.join(devs)}. Date: {_report.today()}. Command: `{cmd}`\n\n"
            f"Chunks of {group.chunk // 2**20} MiB. The threaded backend ran on the same devices in rank 0's "
            f"process; MPI Allreduce sums host arrays of the same size (no GPU copies). The shared-memory "
            f"reduction is the backend's all-reduce of a host array of the same size (`host_all_reduce`: the "
            f"path a tensor takes once on the host, without the device copies); host memcpy is every process "
            f"copying the same bytes at once on its host pool (its share of the host's cores: the target's "
            f"reference), next to the same copy as one np.copyto on one thread." + (
                " Across hosts: the leaders' exposed step is the time a leader spent in its MPI step that no "
                "host work hid (Iallreduce calls, and waits once the step's host tasks were done; least over "
                "the leaders), in flight from each start to the test that saw it complete; the one-host "
                "all-reduce runs on each host's own ranks (all hosts at once), and processes / (one host + "
                "Iallreduce) below 1 means the leaders' step overlaps the host's work." if group.num_hosts > 1
                else "") + f"\n\n{table}\n"
            + "".join(f"\n{t}" for t in tables))
    print(body)
    _report.finish(args, f"allreduce_mpi:{_report.slug(name)}:{group.num_hosts}-host", body)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--devices", type=int, default=2)
    _spmd.add_backend_flag(ap)
    ap.add_argument("--sizes-mb", type=float, nargs="+", default=[1, 4, 16])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--profile", action="store_true",
                    help="--backend mpi: print where each all-reduce's time goes, per process and on threads")
    _report.add_report_flags(ap)
    args = ap.parse_args()
    if args.backend == "mpi":
        main_mpi(args)
        return
    ctx = MultiAdapterContext(args.devices, timeout=600)
    devs = ", ".join(_report.device_line(d) for d in ctx.devices)
    print(f"devices: {devs}")
    rows = []
    for mb in args.sizes_mb:
        rows.append(measure(ctx, mb, args.repeat))
        wgpar.empty_cache()  # the last size's buffers go back before the next, larger one
    table = _report.markdown_table(
        ["MiB", "all-reduce ms", "all-reduce GB/s", "floor ms", "floor GB/s", "ratio (target <= 1.5)"], rows)
    body = (f"### All-reduce on {ctx.world_size} devices: {ctx.devices[0].adapter_name}\n\n"
            f"Devices: {devs}. Date: {_report.today()}. Command: `{_report.command_line()}`\n\n{table}\n")
    print(body)
    _report.finish(args, f"allreduce:{_report.slug(ctx.devices[0].adapter_name)}", body)
    ctx.close()


if __name__ == "__main__":
    main()
