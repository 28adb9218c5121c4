"""Point-to-point mistakes under mpiexec -n 2 fail the job naming the message: a recv whose sender ended
its program without sending names the recv (source, tag, rank), not the end-of-program gather it met;
a send that nobody receives (small: delivered eagerly, so the sender's request completes; or large)
fails the job naming sender, receiver, tag and bytes instead of exiting 0."""

from __future__ import annotations

import re
import uuid

import pytest

from .test_mpi import _finish_all, _leftovers, _start

pytestmark = pytest.mark.multidevice

TIMEOUT = 30  # the jobs' wait timeout: each mistake must be found well before it
CASES = {
    "unmatched_recv": [r"recv on rank 0 from rank 1 \(tag 7\)", r"never (matched|sent)"],
    "unreceived_send": [r"rank 1", r"rank 0", r"tag 5", r"32 bytes", r"never received"],
    "unreceived_large": [r"rank 1", r"rank 0", r"tag 5", r"262144 bytes", r"never received"],
}


def test_p2p_mistakes_fail_the_job_naming_the_message():
    token = f"tok{uuid.uuid4().hex[:12]}"
    jobs = {mode: _start(2, "p2p", mode, str(TIMEOUT), f"{token}{mode}") for mode in CASES}
    ended = _finish_all(jobs, 150)
    for mode, (rc, out, err, end) in ended.items():
        assert rc != 0, f"{mode}: mpiexec returned 0\n{out}\n{err[-4000:]}"
        text = out + err
        for pattern in CASES[mode]:
            assert re.search(pattern, text), f"{mode}: no {pattern!r} in\n{out}\n{err[-4000:]}"
        if mode == "unmatched_recv":
            raised = [ln for ln in out.splitlines() if ln.startswith("RAISED rank 0: ")]
            assert raised and "recv" in raised[0] and "tag 7" in raised[0], (out, err[-4000:])
        up = max(float(ln.split()[2]) for ln in out.splitlines() if ln.startswith("UP "))
        assert end - up < 20, f"{mode}: the job took {end - up:.1f} s after every rank was up (timeout {TIMEOUT})"
    left = _leftovers(token, {p.pid for p in jobs.values()})
    assert not left, f"processes left behind: {left}"
