"""The MPI backend's building blocks that need no MPI: chunked transfers through leased mapped buffers,
and the sizing of the shared-memory arena."""

from __future__ import annotations

import os
import time
from types import SimpleNamespace

import numpy as np
import pytest

import wgpar
from wgpar.distributed.backends import shm, staging
from wgpar.distributed.backends.chunked import ChunkedReadback, ChunkedUpload
from wgpar.distributed.backends.common import round4
from wgpar.distributed.backends.staging import TransferPool
from wgpar.runtime.transfer import UploadBuffer

CHUNK = 1 << 16


def test_readback_in_chunks_reads_any_span_in_place(dev, rng):
    n = 100_003  # 6 chunks of 64 KiB and a ragged tail
    a = rng.standard_normal(n).astype(np.float32)
    pool = TransferPool(dev, "test")
    rb = ChunkedReadback(pool, wgpar.tensor(a, device=dev), CHUNK)
    assert rb.nbytes == 4 * n and pool.num_created == -(-4 * n // CHUNK)
    pieces = rb.span(CHUNK - 8, 24, 10, "test")  # straddles the first chunk boundary
    assert [len(p) for _, p in pieces] == [8, 16] and [off for off, _ in pieces] == [0, 8]
    np.testing.assert_array_equal(rb.array(4 * 16_380, 8, np.dtype(np.float32), 10, "test"), a[16_380:16_388])
    np.testing.assert_array_equal(rb.array(0, n, np.dtype(np.float32), 10, "test"), a)
    del pieces
    rb.release()
    assert pool.num_idle == pool.num_created


def test_readback_never_read_goes_back_to_the_pool(dev):
    pool = TransferPool(dev, "test")
    ChunkedReadback(pool, wgpar.ones(50_000, device=dev), CHUNK).release()  # maps still pending
    assert pool.num_abandoned == 0 and pool.num_idle == pool.num_created == 4


def test_readback_of_a_strided_view(dev, rng):
    a = rng.standard_normal((40, 7)).astype(np.float32)
    pool = TransferPool(dev, "test")
    rb = ChunkedReadback(pool, wgpar.tensor(a, device=dev)[:, 2:5].T, 64)  # copied contiguous first
    np.testing.assert_array_equal(rb.array(0, 120, np.dtype(np.float32), 10, "t").reshape(3, 40), a[:, 2:5].T)
    rb.release()


@pytest.mark.parametrize("dtype,divide", [("float32", None), ("float32", 3.0), ("int32", None), ("float16", None)])
def test_upload_in_chunks_through_leased_buffers(dev, rng, dtype, divide):
    if dtype == "float16" and not dev.has_f16:
        pytest.skip("no shader-f16")
    n = 100_001
    src = rng.uniform(-100, 100, n).astype(np.float32)
    if dtype == "int32":
        src = src.astype(np.int32)  # results arrive in the target's kind (float16 targets: float32 sums)
    target = wgpar.zeros(n, dtype=dtype, device=dev)
    item = np.dtype(dtype)
    buf = target._storage.buffer
    pool = TransferPool(dev, "test")
    up = ChunkedUpload(pool, target.nbytes, CHUNK, item, lambda j, s, e: [(0, buf, s, round4(e - s))], 10, "t")
    for a in range(0, n, 10_007):  # writes straddle chunk boundaries
        b = min(a + 10_007, n)
        up.write(a * item.itemsize, src[a:b], divide)
        up.advance(b * item.itemsize)
    up.finish()
    want = (src / divide if divide else src).astype(item)
    np.testing.assert_array_equal(target.numpy(), want)
    assert pool.num_idle == pool.num_created  # every buffer given back at its commit


@pytest.mark.parametrize("room", [True, False])
def test_upload_leases_new_buffers_while_the_copies_wait_in_the_queue(dev, rng, monkeypatch, room):
    """Each chunk's buffer goes back to the pool at its commit and is leased again only once the GPU has run
    its copy (stood in for here: never); until then the pool makes more, within its cap (without room: the
    oldest, waited for)."""
    monkeypatch.setattr(UploadBuffer, "mapped_again", lambda self, poll: False)
    if not room:
        monkeypatch.setattr(staging, "UPLOAD_BYTES_CAP", 0)
    n = 8 * CHUNK // 4 - 5  # 8 chunks, the last ragged
    src = rng.standard_normal(n).astype(np.float32)
    target = wgpar.zeros(n, device=dev)
    buf = target._storage.buffer
    pool = TransferPool(dev, "test")
    up = ChunkedUpload(pool, target.nbytes, CHUNK, np.dtype(np.float32), lambda j, s, e: [(0, buf, s, round4(e - s))],
                       10, "t")
    for a in range(0, n, 9_001):
        b = min(a + 9_001, n)
        up.write(a * 4, src[a:b])
        up.advance(b * 4)
    up.finish()
    np.testing.assert_array_equal(target.numpy(), src)
    # Without room the two open at once (a write straddles a chunk boundary) serve every chunk.
    assert pool.num_created == (8 if room else 2) and pool.num_idle == pool.num_created


def test_upload_lease_takes_a_buffer_mapped_again_not_one_still_remapping(dev, rng, monkeypatch):
    """A buffer given back re-maps only once the GPU has run its copy (queued behind all earlier work:
    during backward, the rest of backward): the next lease takes one already mapped again, or a new one,
    and waits for the oldest only past UPLOAD_BYTES_CAP."""
    pool = TransferPool(dev, "test")
    src = rng.integers(1, 255, 1000).astype(np.uint8)
    target = wgpar.zeros(250, device=dev)
    a = pool.up(1000)
    np.frombuffer(a.view(10), np.uint8)[:1000] = src
    a.commit(target._storage.buffer, 0, 1000)
    pool.give_back(a)
    remapping = {id(a)}  # the GPU's copy out of ``a`` stands for one still queued
    monkeypatch.setattr(UploadBuffer, "mapped_again", lambda self, poll: id(self) not in remapping)
    b = pool.up(1000)
    assert b is not a and pool.num_created == 2
    pool.give_back(b)
    assert pool.up(1000) is b  # ready: reused, nothing made
    pool.give_back(b)
    remapping.add(id(b))
    monkeypatch.setattr(staging, "UPLOAD_BYTES_CAP", pool.host_bytes())
    assert pool.up(1000) is a and pool.num_created == 2  # past the cap: the oldest, whose view waits
    np.frombuffer(a.view(10), np.uint8)[:4] = 0  # its re-map did finish
    np.testing.assert_array_equal(target.numpy().view(np.uint8), src)
    monkeypatch.undo()
    a.commit(target._storage.buffer, 0, 4)
    deadline = time.monotonic() + 10
    while not a.ready:  # the real check: a non-blocking poll until the copy has run and the map is back
        assert time.monotonic() < deadline, "an upload buffer's re-map never finished"
        time.sleep(0.001)
    pool.give_back(a)
    assert pool.num_idle == pool.num_created == 2
    assert (target.numpy().view(np.uint8)[:4] == 0).all()


def test_mailbox_slots_hold_a_pipeline_activation_within_1_gib_and_dev_shm(monkeypatch):
    """Slots per sending rank, 64 MiB where every rank's 4 fit in 1 GiB (2-4 ranks), 32 MiB on 8 ranks, at
    most the chunk; halved to a quarter of /dev/shm's free space; none for one rank or below 64 KiB."""
    free = {"bytes": 128 << 30}
    monkeypatch.setattr(os, "statvfs", lambda path: SimpleNamespace(f_bavail=free["bytes"] // 4096, f_frsize=4096))
    MiB = 1 << 20
    assert [shm.mail_slot_cap(n, 64 * MiB) for n in (1, 2, 3, 4, 5, 8, 16)] == \
        [0, 64 * MiB, 64 * MiB, 64 * MiB, 32 * MiB, 32 * MiB, 16 * MiB]
    for n in range(2, 40):
        cap = shm.mail_slot_cap(n, 64 * MiB)
        assert n * shm.MAIL_SLOTS * cap <= shm.MAIL_BUDGET < n * shm.MAIL_SLOTS * cap * 2 or cap == 64 * MiB
    assert shm.mail_slot_cap(2, 16 * MiB) == 16 * MiB  # across hosts: the 16 MiB chunk
    free["bytes"] = 64 * MiB  # a container's default /dev/shm: 2 ranks x 4 slots in 16 MiB
    assert shm.mail_slot_cap(2, 64 * MiB) == 2 * MiB
    free["bytes"] = 1 * MiB
    assert shm.mail_slot_cap(2, 64 * MiB) == 0


def test_shared_arena_slots_fit_in_dev_shm(monkeypatch):
    free = {"bytes": 64 << 20}  # a container's default /dev/shm
    monkeypatch.setattr(os, "statvfs", lambda path: SimpleNamespace(f_bavail=free["bytes"] // 4096, f_frsize=4096))
    cap = shm.shm_slot_cap(local_size=8, chunk=16 << 20)
    assert 2 * 9 * cap <= (64 << 20) // 2 and cap == 1 << 20
    free["bytes"] = 64 << 30
    assert shm.shm_slot_cap(local_size=8, chunk=16 << 20) == 16 << 20
    assert shm.slot_size(10, 16 << 20) == 1 << 16  # at least 64 KiB
    assert shm.slot_size((3 << 20) + 1, 16 << 20) == 4 << 20
    assert shm.slot_size(1 << 30, 16 << 20) == 16 << 20
