"""The MPI backend, one process per rank under mpiexec (tests/mpi_runner.py runs inside the processes):
the conformance suite on 2 and 3 processes (one host, and two simulated hosts), the pipelined all-reduce
across simulated hosts of 1, 2 and 3 ranks, DistributedDataParallel
equal to thread ranks bit for bit and to one device within 1e-5, failures that end the job, and the
benchmarks' --backend mpi mode (processes next to thread ranks, same losses)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import numpy as np
import pytest

import wgpar
from wgpar.distributed import run_spmd
from wgpar.nn import functional as F

from . import conformance, mpi_runner

pytestmark = pytest.mark.multidevice

ROOT = Path(__file__).resolve().parents[1]
RUNNER = ROOT / "tests" / "mpi_runner.py"


def _mpiexec() -> str | None:
    beside = Path(sys.executable).parent / "mpiexec"  # pip install mpich puts it in the venv
    return str(beside) if beside.exists() else shutil.which("mpiexec")


def _why_no_mpi() -> str | None:
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        return "mpi4py is not installed (pip install 'wgpar[mpi]'; make test installs it)"
    if _mpiexec() is None:
        return "no mpiexec (pip install mpich)"
    return None


if _why_no_mpi():
    pytest.skip(_why_no_mpi(), allow_module_level=True)


def _command(n: int, *args: str, script: Path | None = None) -> list[str]:
    """mpiexec running tests/mpi_runner.py (under mpi4py's guard) with ``args``, or ``script`` as a user runs it."""
    cmd = [_mpiexec(), "-n", str(n)]
    version = subprocess.run([cmd[0], "--version"], capture_output=True, text=True).stdout
    if "Open MPI" in version or "OpenRTE" in version:
        cmd += ["--oversubscribe"] + (["--allow-run-as-root"] if os.geteuid() == 0 else [])
    program = [str(script)] if script is not None else ["-m", "mpi4py", str(RUNNER)]
    return cmd + [sys.executable, *program, *args]


def _start(n: int, *args: str, env: dict | None = None, script: Path | None = None) -> subprocess.Popen:
    """Launch mpiexec in a session of its own; stdout and stderr go to files (jobs that run at once
    must not block on a full pipe) and stay apart: the ranks' lines interleave, but each print of a
    whole line stays whole."""
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)  # keep the caller's
    full_env = dict(os.environ, PYTHONPATH=path, XDG_RUNTIME_DIR=os.environ.get("XDG_RUNTIME_DIR", "/tmp"),
                    WGPAR_MPI_CHUNK_KB="64")  # small chunks: the conformance sizes span many of them
    full_env.update(env or {})
    out, err = tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+")
    proc = subprocess.Popen(_command(n, *args, script=script), stdout=out, stderr=err, text=True, env=full_env,
                            cwd=ROOT, start_new_session=True)
    proc.logs = (out, err)
    return proc


def _finish(proc: subprocess.Popen, limit: float) -> tuple[int, str, str]:
    """Exit status, stdout and stderr; a job still running after ``limit`` is killed and fails."""
    try:
        proc.wait(timeout=limit)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        proc.wait()
    texts = []
    for f in proc.logs:
        f.seek(0)
        texts.append(f.read())
        f.close()
    if proc.returncode == -9:
        pytest.fail(f"mpiexec still running after {limit} s:\n{texts[0][-2000:]}\n{texts[1][-4000:]}")
    return proc.returncode, texts[0], texts[1]


def _finish_all(jobs: dict[str, subprocess.Popen], limit: float) -> dict[str, tuple[int, str, str, float]]:
    """Wait for jobs that run at once: each one's (returncode, stdout, stderr, time it ended)."""
    ended: dict[str, tuple[int, str, str, float]] = {}

    def wait(name: str) -> None:
        ended[name] = (*_finish(jobs[name], limit), time.time())

    waiters = [threading.Thread(target=wait, args=(name,)) for name in jobs]
    for t in waiters:
        t.start()
    for t in waiters:
        t.join()
    return ended


def _leftovers(token: str, sessions: set[int], wait: float = 10.0) -> list[str]:
    """Processes whose command line carries ``token`` or that belong to one of the launchers' sessions
    (mpiexec's proxies and everything they started), given up to ``wait`` s to finish dying."""
    deadline = time.monotonic() + wait
    while True:
        ps = subprocess.run(["ps", "-eo", "pid,sid,stat,args"], capture_output=True, text=True).stdout
        alive = []
        for line in ps.splitlines()[1:]:
            pid, sid, stat, args = (line.split(None, 3) + [""])[:4]
            if not stat.startswith("Z") and (token in args or int(sid) in sessions):
                alive.append(line)
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.1)


def _single_device(seed: int) -> dict[str, np.ndarray]:
    X, Y = mpi_runner.ddp_data(seed)
    model = mpi_runner.ddp_model(seed, wgpar.device(0))  # rank 0's initial weights (the broadcast's)
    opt = mpi_runner.ddp_optimizer(model.parameters())
    losses = []
    for k in range(mpi_runner.DDP_STEPS):
        opt.zero_grad()
        loss = F.cross_entropy(model(wgpar.tensor(X[k])), Y[k])
        loss.backward()
        opt.step()
        losses.append(loss.item())
    out = {f"param.{k}": v.numpy() for k, v in model.state_dict().items()}
    out["losses"] = np.array(losses, np.float32)
    return out


CONFIGS = {"2proc-1host": (2, None), "3proc-1host": (3, None), "3proc-2hosts": (3, 2)}  # processes, per host


@pytest.fixture(scope="module")
def conformance_jobs(tmp_path_factory):
    """The launches start together (their start-up and waits overlap); each test waits for its own."""
    jobs = {}
    for name, (n, per_host) in CONFIGS.items():
        seed = int.from_bytes(os.urandom(4), "little") >> 2
        path = tmp_path_factory.mktemp(name) / "results.npz"
        env = {"WGPAR_MPI_RANKS_PER_HOST": str(per_host)} if per_host else {}
        jobs[name] = (seed, path, _start(n, "conformance", str(seed), str(path), env=env))
    yield jobs
    for _, _, proc in jobs.values():
        if proc.poll() is None:
            os.killpg(proc.pid, 9)


@pytest.mark.parametrize("name", CONFIGS)
def test_conformance_and_data_parallel_under_mpiexec(conformance_jobs, name):
    (n, per_host), (seed, out_path, proc) = CONFIGS[name], conformance_jobs[name]
    rc, out, err = _finish(proc, 300)
    assert rc == 0, f"seed {seed}\n" + out[-2000:] + err[-6000:]
    got = np.load(out_path)
    names = [c.__name__ for c in conformance.ALL_CHECKS + mpi_runner.MPI_CHECKS]
    for r in range(n):
        ran = [c.split()[0] for c in got[f"{r}.checks"]]
        assert ran == names, f"rank {r} ran {ran}"
    hosts = {int(got[f"{r}.host"][1]) for r in range(n)}
    assert hosts == {-(-n // per_host) if per_host else 1}

    # DistributedDataParallel: every rank ends with the same parameters, bit for bit those of the same
    # program on thread ranks (the host reduction sums in the same rank order), and within 1e-5 of
    # one device training on the whole batch.
    keys = [k[2:] for k in got.files if k.startswith("0.") and k[2:] not in ("checks", "host")]
    threads = run_spmd(mpi_runner.train_ddp, n, backend="threads", args=(seed,), timeout=60)[0]
    single = _single_device(seed)
    ddp_keys = [k for k in keys if k == "losses" or k.startswith("param.")]
    assert ddp_keys and all(k in threads for k in ddp_keys)
    for k in ddp_keys:
        for r in range(1, n):
            np.testing.assert_array_equal(got[f"{r}.{k}"], got[f"0.{k}"], err_msg=f"rank {r} {k}")
        np.testing.assert_array_equal(got[f"0.{k}"], threads[k], err_msg=f"MPI vs threads: {k}")
        np.testing.assert_allclose(got[f"0.{k}"], single[k], rtol=1e-5, atol=1e-5, err_msg=f"MPI vs one device: {k}")

    # Tensor parallelism, the pipeline and FSDP run on MPI ranks unchanged, bit for bit as on thread ranks.
    strategies = run_spmd(mpi_runner.train_strategies, n, backend="threads", args=(seed,), timeout=60)
    for r in range(n):
        mine = {k[len(f"{r}."):] for k in got.files if k.startswith((f"{r}.tp.", f"{r}.pipe.", f"{r}.fsdp."))}
        assert mine == set(strategies[r]), (r, sorted(mine), sorted(strategies[r]))
        for k in mine:
            np.testing.assert_array_equal(got[f"{r}.{k}"], strategies[r][k], err_msg=f"rank {r} {k}: MPI vs threads")


# simulated hosts: processes, ranks per host ("1x3": one host, the one-host pipeline with ranks drifting apart)
HOSTS = {"2x2": (4, 2), "2x1": (2, 1), "3+2": (5, 3), "1x3": (3, 3)}


def test_the_pipelined_all_reduce_across_hosts_at_awkward_sizes_with_ranks_drifting_apart():
    """``check_hosts_pipelined`` (the leaders' step of chunk i in flight while the host works on chunks
    i + 1 and i - 1) on 2 hosts of 2 ranks, of 1 rank and of 3 and 2 ranks, and the one-host pipeline on 3
    ranks (input sets reused too early show), every rank's steps delayed at random by up to 2 ms so that
    ranks run ahead as far as the barriers allow: bit for bit the host-then-leaders fold. (The 3proc-2hosts
    conformance job covers the rest of the API across hosts.) The jobs run at once."""
    seed = int.from_bytes(os.urandom(4), "little") >> 2
    jobs = {name: _start(n, "hosts", str(seed), "0.002", env={"WGPAR_MPI_RANKS_PER_HOST": str(per)})
            for name, (n, per) in HOSTS.items()}
    for name, (rc, out, err, _) in _finish_all(jobs, 240).items():
        n, per = HOSTS[name]
        assert rc == 0, f"{name}, seed {seed}\n" + out[-2000:] + err[-6000:]
        hosts = re.search(r"HOSTS (.*)", out).group(1).split()
        assert [int(h.split(",")[0]) for h in hosts] == [r // per for r in range(n)], (name, hosts)


FAULTS = {  # rank 1's misbehaviour -> processes (fewer where a third adds nothing), what the others raise
    "raise": (3, re.escape("rank 1 failed: ValueError: injected failure on rank 1")),
    "sysexit": (2, re.escape("rank 1 failed: SystemExit: 0")),
    "return": (2, re.escape("rank 1 called gather_objects[run_spmd] as collective #1 while rank 0 called all_reduce")),
    # (on a loaded machine a slow rank 2 may be missing too when the first timeout fires)
    "skip": (3, r"rank\(s\) \[1(, 2)?\] did not arrive within 3 s"),
    "nosend": (2, re.escape("recv on rank 0: no message from rank 1 (tag 7) within 3 s")),
    # rank 1 stops inside the all-reduce, past its header exchange: the others time out in the host barrier
    "stall": (3, re.escape("rank(s) [1] of this host stopped inside the collective for 3 s")),
    # the same at the second step of a 13-chunk all-reduce: rank 0 times out with copies started ahead
    "stall_late": (2, re.escape("rank(s) [1] of this host stopped inside the collective for 3 s")),
    # one rank per host: rank 1 stops at the fourth step of a 13-chunk all-reduce; rank 0 waits in the
    # leaders' step and names the other host
    "stall_host": (2, r"the leaders' all-reduce of chunk \d+ \(\d+ bytes\) did not complete within 3 s: a rank of "
                      r"another host stopped inside the collective \(host 1: ranks \[1\] \(leader rank 1\)\)"),
}
FAULT_ENV = {"stall_host": {"WGPAR_MPI_RANKS_PER_HOST": "1"}}
TIMEOUT = 3  # the jobs' collective timeout


def test_a_failing_rank_ends_the_job_and_every_other_rank_raises_naming_it():
    """Rank 1 raises / calls sys.exit / leaves its program early / never calls the collective / stops inside
    it (on rank 0's host, or on a host of its own), while ranks 0 and 2 wait in an all-reduce (or never
    sends what rank 0 waits for): every other rank
    raises an error naming rank 1, mpiexec returns non-zero within the timeout of the ranks being up
    (nobody waits for the acknowledgement of a rank that never arrived; a slack for a loaded machine),
    and no process of the job is left. The jobs run at once."""
    token = f"tok{uuid.uuid4().hex[:12]}"
    jobs = {mode: _start(n, "fault", mode, str(TIMEOUT), f"{token}{mode}", env=FAULT_ENV.get(mode))
            for mode, (n, _) in FAULTS.items()}
    ended = _finish_all(jobs, 120)
    for mode, (rc, out, err, end) in ended.items():
        n, pattern = FAULTS[mode]
        assert rc != 0, f"{mode}: mpiexec returned 0\n{out}\n{err[-4000:]}"
        for r in (0, 2)[:n - 1]:
            lines = [ln for ln in out.splitlines() if ln.startswith(f"RAISED rank {r}: ")]
            assert lines, f"{mode}: rank {r} did not raise\n{out}\n{err[-4000:]}"
            assert re.search(pattern, lines[0]), f"{mode}, rank {r}: {lines[0]}"
        # rank 1 sleeps until the abort ends it
        sleeps = mode in ("skip", "nosend", "stall", "stall_late", "stall_host")
        if not sleeps:  # rank 1 reports its own failure too
            assert f"wgpar: rank 1 of {n} failed" in err, (mode, err[-4000:])
        up = max(float(ln.split()[2]) for ln in out.splitlines() if ln.startswith("UP "))
        limit = (TIMEOUT if sleeps else 0) + 20  # + a margin for a loaded 2-core machine
        assert end - up < limit, f"{mode}: the job took {end - up:.1f} s after every rank was up"
    left = _leftovers(token, {p.pid for p in jobs.values()})  # each launcher leads its own session
    assert not left, f"processes left behind: {left}"


TINY = ("--width", "32", "--batch", "16", "--steps", "1")
BENCHES = {  # the --backend mpi benchmarks at a tiny size: script -> its own flags
    "bench_data_parallel": ("--layers", "2"),
    "bench_fsdp": ("--layers", "2", "--strategies", "dp,full,offload"),
    "bench_pipeline": ("--layers", "4", "--microbatches", "2", "--schedules", "1f1b,interleaved",
                       "--profile-steps", "1"),
}


@pytest.mark.parametrize("bench", BENCHES)
def test_benchmark_on_processes_next_to_threads(bench, tmp_path):
    """Each benchmark's --backend mpi mode runs as documented (mpiexec, plain python) and rank 0 writes its
    section: processes next to thread ranks on the same devices, whose losses are the same bits."""
    md = tmp_path / "BENCHMARKS.md"
    proc = _start(2, *TINY, *BENCHES[bench], "--backend", "mpi", "--md", str(md),
                  script=ROOT / "benchmarks" / f"{bench}.py")
    rc, out, err = _finish(proc, 240)
    assert rc == 0, out[-2000:] + err[-4000:]
    text = md.read_text()
    assert re.search(r"threads vs MPI processes", text), text
    assert "mpiexec -n 2 python benchmarks/" in text, text
    losses = re.findall(r"same bits|differ by up to [^ |.]+|shapes \([^)]*\) and \([^)]*\)", text)
    assert losses and set(losses) == {"same bits"}, text


@pytest.mark.parametrize("floats", [1 << 18, 8000], ids=["mpi-path", "mailbox"])
def test_a_send_moves_while_its_senders_communication_thread_waits_elsewhere(floats):
    """Rank 0 sends 1 MiB (larger than a mailbox slot under these tests' 64 KiB chunks: MPI messages) or
    32 KB (a mailbox slot, MPI carries its header), then its communication thread waits 4 s without
    calling MPI (as it does for a readback's map); rank 1's recv must not wait for that. MPICH here runs
    without its single-copy path (CMA off: what it does under ptrace_scope restrictions), where a message
    moves only while both processes call MPI: before the sends had a thread of their own, the 1 MiB
    recv took the 4 s and more."""
    proc = _start(2, "p2p_progress", "4", str(floats), env={"MPIR_CVAR_CH4_CMA_ENABLE": "0"})
    rc, out, err = _finish(proc, 120)
    assert rc == 0, out[-2000:] + err[-4000:]
    ms = float(re.search(r"RECEIVED in ([\d.]+) ms", out).group(1))
    assert ms < 2000, f"rank 1's recv of {4 * floats} bytes took {ms:.0f} ms while rank 0's comm thread was busy"


def test_the_send_pump_releases_each_send_once_taken_and_hands_back_what_is_left():
    """SendPump, without MPI: a send's buffers go back once all its requests completed, in any order;
    stop() hands the requests still in flight to the caller (quiesce waits for them)."""
    from wgpar.distributed.backends.mpi_sends import SendPump

    done = {"a": False, "b": False}
    released = []
    pump = SendPump(lambda reqs: all(done[r] for r in reqs), "test-sends", pause=0.0005)
    pump.add(["a"], lambda: released.append("a"))
    pump.add(["b", "a"], lambda: released.append("b"))
    pump.add(["c"], lambda: released.append("c"))  # never completes
    done["c"] = False
    done["b"] = True
    time.sleep(0.05)
    assert released == [] and pump.pending == 3
    done["a"] = True
    deadline = time.monotonic() + 5
    while len(released) < 2 and time.monotonic() < deadline:
        time.sleep(0.001)
    assert sorted(released) == ["a", "b"] and pump.completed == 2
    assert pump.stop() == [["c"]]
    with pytest.raises(RuntimeError, match="after the pump stopped"):
        pump.add(["d"], lambda: None)
    assert not [t for t in threading.enumerate() if t.name == "test-sends"]


def test_the_chunk_is_64_mib_inside_a_host_within_a_1_gib_arena_and_16_mib_across_hosts(monkeypatch):
    """Unset WGPAR_MPI_CHUNK_KB: each chunk costs a host step about a millisecond besides its bytes, so one
    host pipelines 64 MiB chunks (BENCHMARKS.md, "MPI notes"), halved while the shared arena's 3 L + 2 slots
    would pass 1 GiB, never below 16 MiB; across hosts 16 MiB. Set, the variable wins (rounded up to a power
    of two, at least 64 KiB)."""
    from wgpar.distributed.backends.mpi import default_chunk
    from wgpar.distributed.backends.shm import arena_slots
    from wgpar.runtime import config

    MiB = 1 << 20
    assert [default_chunk(L, 1) // MiB for L in (1, 2, 3, 4, 5, 8, 16, 64)] == [64, 64, 64, 64, 32, 32, 16, 16]
    assert all(default_chunk(L, h) == 16 * MiB for L in (1, 2, 8) for h in (2, 5))
    for L in range(1, 40):
        c = default_chunk(L, 1)
        assert c == 16 * MiB or arena_slots(L) * c <= 1 << 30
        assert c == 64 * MiB or arena_slots(L) * 2 * c > 1 << 30
    monkeypatch.delenv("WGPAR_MPI_CHUNK_KB", raising=False)
    assert config.load().mpi_chunk_kb is None
    monkeypatch.setenv("WGPAR_MPI_CHUNK_KB", "64")
    assert config.load().mpi_chunk_kb == 64
