"""Device: one GPUDevice with its allocator, kernel caches and batched command stream.

Ops record dispatches into one open compute pass of a pending command
encoder; the encoder is submitted on readback, upload, cross-device copy,
``synchronize``, or once ``submit_threshold`` dispatches are pending
(a submit costs 50-100 us; a dispatch inside an open pass a few us).
Every public method takes the device lock, so several threads may share a
device, and threads driving different devices never contend.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any

import wgpu

from ..errors import BindingLimitError, OutOfMemoryError, WgparError
from . import native as _native
from . import profiling as _prof
from . import transfer as _transfer
from .allocator import STORAGE_USAGE, Block, CachingAllocator, create_with_retry
from .config import CONFIG
from .kernels import PARAM_SLOT, KernelSpec, dump_wgsl

_ARENA_SLOTS = 1024
_LARGE_UPLOAD = 1 << 20  # bytes; smaller uploads use queue.write_buffer
_UPLOAD_TIMEOUT = 300.0
_BIND_GROUP_CACHE_MAX = 8192
_RAMP = 16  # dispatches before the first submit after the host waited for the GPU (Device._idle), on a CPU
# adapter; on a GPU the first dispatch goes at once, then 4, then 16, the batches doubling from there. For
# _EARLY_S after the wait a GPU's batch is also submitted once _EARLY_GAP_S passed since the last submit,
# so a short burst of work (a few calls, then a wait) does not leave a large batch for the GPU to start
# only at the wait. A submit costs the host 50-80 us (H100, Vulkan), so only while the GPU is likely idle.
_EARLY_S = 0.005
_EARLY_GAP_S = 0.001
_READBACK_BYTES = 256  # Device.read_later's staging buffers

_LIMIT_KEYS = ("max-storage-buffer-binding-size", "max-buffer-size", "max-compute-workgroup-storage-size",
               "max-compute-invocations-per-workgroup", "max-compute-workgroups-per-dimension")
# Timestamp queries cost nothing until a profile makes a query set (docs/design.md, "Profiling").
_WANTED_FEATURES = ("shader-f16", "subgroup", *_prof.TIMESTAMP_FEATURES)


def adapter_kind(name: str, adapter_type: str) -> str:
    """What kernel choices are keyed by: "cpu" for a CPU adapter, else the GPU's vendor ("nvidia", "amd",
    "apple", "intel") or "gpu"."""
    if adapter_type.lower() == "cpu":
        return "cpu"
    name = name.lower()
    for kind, marks in (("nvidia", ("nvidia",)), ("amd", ("amd", "radeon")), ("apple", ("apple",)),
                        ("intel", ("intel",))):
        if any(v in name for v in marks):
            return kind
    return "gpu"


class Device:
    """A WebGPU device that owns tensors' memory and runs their kernels.

    Arguments:
        adapter: the wgpu adapter the device is created on.
        index: the device's wgpar index (``wgpar.device(index)``).
        logical: which of several devices on one adapter this is (0 for the first).
    """

    def __init__(self, adapter: wgpu.GPUAdapter, index: int, logical: int = 0) -> None:
        info = adapter.info
        self.index = index
        self.logical = logical
        self.adapter_name: str = info.get("device", "") or info.get("description", "") or "unknown"
        self.backend: str = info.get("backend_type", "")
        self.adapter_type: str = info.get("adapter_type", "")
        self.kind = adapter_kind(self.adapter_name, self.adapter_type)
        features = [f for f in _WANTED_FEATURES if f in adapter.features]
        try:
            self._dev = adapter.request_device_sync(
                label=f"wgpar:{index}", required_features=features, required_limits=None
            )
        except Exception as exc:
            raise WgparError(
                f"could not create a device on adapter {self.adapter_name!r} ({self.backend}): {exc}") from exc
        self.features = frozenset(str(f) for f in self._dev.features)
        self.limits: dict[str, int] = dict(self._dev.limits)
        self.max_binding = int(self.limits["max-storage-buffer-binding-size"])
        self.max_buffer = int(self.limits["max-buffer-size"])
        self.has_f16 = "shader-f16" in self.features
        # Workgroups per grid dimension (65535 on lavapipe and NVIDIA): ops split larger grids.
        self.max_workgroups = int(self.limits.get("max-compute-workgroups-per-dimension", 65535))
        self.queue = self._dev.queue
        self._lock = threading.RLock()
        self._threshold = CONFIG.submit_threshold
        # A CPU adapter (lavapipe) runs submitted work on the host's own cores: submitting early competes
        # with the recording, so it keeps the longer ramp and no early submits.
        self._early = self.adapter_type.lower() != "cpu"
        self._early_until = 0.0  # perf_counter time when early submits stop (0: not in that window)
        self._last_submit = 0.0
        self.allocator = CachingAllocator(self._create_storage, min(self.max_binding, self.max_buffer),
                                          self._forget_buffers, name=str(self))
        self.allocator.reclaim = self.empty_cache
        self.allocator.device_index = index
        self.allocator.set_limit(CONFIG.memory_limit)
        self._pipelines: dict[KernelSpec, tuple[Any, Any]] = {}
        # id(kspec) -> (kspec, pipeline, layout, native pipeline): KernelSpec hashes in Python, an id in C
        self._pipes: dict[int, tuple] = {}
        self._native = _native.PASS_CALLS
        self._offset_arg = self._native[3].new("uint32_t[1]") if self._native else None  # set_bind_group's one offset
        self._pass_handle: Any = None
        self._bind_groups: dict[tuple, Any] = {}
        self._staging: dict[int, wgpu.GPUBuffer] = {}
        self._upload_ring = None
        align = int(self.limits.get("min-uniform-buffer-offset-alignment", 256))
        self._slot = max(PARAM_SLOT, align)
        self._arena = self._dev.create_buffer(
            label=f"wgpar:{index}:params", size=self._slot * _ARENA_SLOTS,
            usage=wgpu.BufferUsage.UNIFORM | wgpu.BufferUsage.COPY_DST | wgpu.BufferUsage.COPY_SRC)
        self._arena_host = bytearray(self._slot * _ARENA_SLOTS)
        self._readbacks: list[wgpu.GPUBuffer] = []  # read_later's free staging buffers
        self._fence = self._dev.create_buffer(
            label=f"wgpar:{index}:fence", size=16, usage=wgpu.BufferUsage.MAP_READ | wgpu.BufferUsage.COPY_DST)
        self._encoder: Any = None
        self._pass: Any = None
        self._pass_pipeline: Any = None
        self._pending = 0
        self._arena_used = 0
        self.num_submits = 0
        self.num_dispatches = 0
        self.max_dispatches_per_submit = _ARENA_SLOTS  # a full parameter arena submits
        self._ptrack: _prof.DeviceTrack | None = None  # set while a profile records this device
        _prof.DEVICES.add(self)

    # -- identity -------------------------------------------------------------------------
    def __repr__(self) -> str:
        lim = {k: self.limits[k] for k in _LIMIT_KEYS if k in self.limits}
        logical = f", logical={self.logical}" if self.logical else ""
        return (f"Device(index={self.index}, adapter={self.adapter_name!r}, backend={self.backend!r}, "
                f"type={self.adapter_type!r}{logical}, f16={self.has_f16}, limits={lim})")

    def __str__(self) -> str:
        return f"wgpu:{self.index} ({self.adapter_name}, {self.backend})"

    # -- memory ---------------------------------------------------------------------------
    def _create_storage(self, size: int) -> wgpu.GPUBuffer:
        return self._dev.create_buffer(label=f"wgpar:{self.index}:tensor", size=size, usage=STORAGE_USAGE)

    def create_buffer(self, label: str, size: int, usage, mapped_at_creation: bool = False) -> wgpu.GPUBuffer:
        """A buffer outside the allocator's blocks (readback staging, upload), made through the allocator's
        release-and-retry path: on out-of-memory the cache goes back to wgpu and creation is tried once
        more before OutOfMemoryError names the bytes and this device. Counted in ``memory_stats``'
        ``staging_bytes`` (not ``reserved_bytes``) while it lives.

        Arguments:
            label: what the buffer is for; its wgpu label is ``wgpar:<index>:<label>``.
            size: bytes.
            usage: wgpu.BufferUsage flags.
            mapped_at_creation: whether it starts mapped (upload buffers).
        """
        full = f"wgpar:{self.index}:{label}"

        def create() -> wgpu.GPUBuffer:
            return self._dev.create_buffer(label=full, size=size, usage=usage, mapped_at_creation=mapped_at_creation)

        try:
            buf = create_with_retry(create, self.allocator.reclaim)
        except OutOfMemoryError as exc:
            stats = self.allocator.stats()
            raise OutOfMemoryError(
                f"{self}: out of memory creating the {size}-byte {label} buffer ({full}) for a host transfer, "
                f"after releasing the cache; {stats['allocated_bytes']} bytes allocated by tensors, "
                f"{stats['reserved_bytes']} bytes reserved ({exc})") from None
        self.allocator.track_staging(buf, size)  # memory_stats' staging_bytes until the buffer is dropped
        return buf

    def malloc(self, nbytes: int) -> Block:
        """Take a block of at least ``nbytes`` bytes from this device's caching allocator (wgpar's own, no
        torch counterpart).

        Raises BindingLimitError when ``nbytes`` exceeds the device's largest storage binding
        (max-storage-buffer-binding-size): a tensor must fit in one binding.

        Arguments:
            nbytes: the size in bytes.
        """
        if nbytes > self.max_binding:
            raise BindingLimitError(
                f"{self}: a tensor of {nbytes} bytes exceeds this device's largest storage binding "
                f"({self.max_binding} bytes, max-storage-buffer-binding-size); split it into smaller tensors")
        return self.allocator.malloc(nbytes)

    def _forget_buffers(self, buffers: Sequence[wgpu.GPUBuffer]) -> None:
        if not buffers:
            return
        dead = {id(b) for b in buffers}
        with self._lock:
            for key in [k for k in self._bind_groups if any(id(b) in dead for b in k[1])]:
                del self._bind_groups[key]

    def empty_cache(self) -> int:
        """Return every cached (unused) buffer to wgpu; returns the bytes released."""
        with self._lock:
            self.synchronize()
            released = self.allocator.release_cache()
            self._staging.clear()
            self._upload_ring = None
            # wgpu frees dropped buffers only after a later submit and poll.
            self._fence_and_wait()
            return released

    # -- command stream -------------------------------------------------------------------
    def _compute_pass(self):
        if self._pass is None:
            if self._encoder is None:
                self._encoder = self._dev.create_command_encoder(label=f"wgpar:{self.index}:batch")
            self._pass = self._encoder.begin_compute_pass(label=f"wgpar:{self.index}:pass")
            self._pass_handle = _native.handle(self._pass) if self._native else None
            self._pass_pipeline = None
        return self._pass

    def _end_pass(self):
        if self._pass is not None:
            self._pass.end()
            self._pass = None
            self._pass_handle = None
        if self._encoder is None:
            self._encoder = self._dev.create_command_encoder(label=f"wgpar:{self.index}:batch")
        return self._encoder

    def _pipeline(self, kspec: KernelSpec):
        hit = self._pipelines.get(kspec)
        if hit is not None:
            return hit
        access = kspec.access
        entries = [
            {"binding": i, "visibility": wgpu.ShaderStage.COMPUTE,
             "buffer": {"type": wgpu.BufferBindingType.read_only_storage if a == "r"
                        else wgpu.BufferBindingType.storage}}
            for i, a in enumerate(access)
        ]
        entries.append({"binding": len(access), "visibility": wgpu.ShaderStage.COMPUTE,
                        "buffer": {"type": wgpu.BufferBindingType.uniform, "has_dynamic_offset": True,
                                   "min_binding_size": 0}})
        source = kspec.source()
        if CONFIG.dump_wgsl:
            dump_wgsl(CONFIG.dump_wgsl, kspec, source)
        try:
            module = self._dev.create_shader_module(label=kspec.label, code=source)
            layout = self._dev.create_bind_group_layout(label=kspec.label, entries=entries)
            pl = self._dev.create_pipeline_layout(label=kspec.label, bind_group_layouts=[layout])
            pipeline = self._dev.create_compute_pipeline(
                label=kspec.label, layout=pl,
                compute={"module": module, "entry_point": "main", "constants": dict(kspec.constants)})
        except Exception as exc:
            raise WgparError(f"{self}: building kernel {kspec.label} failed: {exc}") from exc
        self._pipelines[kspec] = (pipeline, layout)
        return pipeline, layout

    def _pipe(self, kspec: KernelSpec) -> tuple:
        """(kspec, pipeline, layout, native handle) for ``kspec``, remembered by its id (held, so no reuse)."""
        pipeline, layout = self._pipeline(kspec)
        hit = self._pipes[id(kspec)] = (kspec, pipeline, layout, _native.handle(pipeline) if self._native else None)
        return hit

    def _bound(self, kspec: KernelSpec, layout, buffers: tuple) -> tuple:
        """(bind group, its native handle) of ``buffers`` for ``kspec``'s layout, made once."""
        key = (layout, buffers)  # the layout stands for the kspec and hashes faster
        hit = self._bind_groups.get(key)
        if hit is None:
            if len(self._bind_groups) >= _BIND_GROUP_CACHE_MAX:
                self._bind_groups.clear()
            entries = [{"binding": i, "resource": {"buffer": b, "offset": 0, "size": b.size}}
                       for i, b in enumerate(buffers)]
            entries.append({"binding": len(buffers),
                            "resource": {"buffer": self._arena, "offset": 0, "size": PARAM_SLOT}})
            bg = self._dev.create_bind_group(label=kspec.label, layout=layout, entries=entries)
            hit = self._bind_groups[key] = (bg, _native.handle(bg) if self._native else None)
        return hit

    def dispatch(self, kspec: KernelSpec, buffers: Sequence[wgpu.GPUBuffer], params: bytes,
                 groups: tuple[int, int] | tuple[int, int, int], flops: int = 0, nbytes: int = 0) -> None:
        """Record one dispatch of ``kspec`` over ``buffers`` (in binding order).

        ``flops`` and ``nbytes`` (the floating-point operations and the bytes the kernel must move,
        where the caller knows them) only reach the profiler.
        """
        lim = self.max_workgroups  # checked here: at submit it would fail the whole batch (~60 ns a call)
        if groups[0] > lim or groups[1] > lim or groups[-1] > lim:
            raise WgparError(f"{self}: kernel {kspec.label} asks for {tuple(groups)} workgroups; this device "
                             f"allows {self.max_workgroups} per dimension (max-compute-workgroups-per-dimension)")
        rec = _prof.ACTIVE
        lock = self._lock
        lock.acquire()  # with try/finally rather than `with`: half the cost (this runs per op)
        try:
            t0 = _prof.now() if rec is not None else 0
            pipe = self._pipes.get(id(kspec))
            if pipe is None or pipe[0] is not kspec:
                pipe = self._pipe(kspec)
            buffers = tuple(buffers)
            bound = self._bind_groups.get((pipe[2], buffers))
            if bound is None:
                bound = self._bound(kspec, pipe[2], buffers)
            if self._arena_used >= _ARENA_SLOTS:
                self._flush_locked()
            offset = self._arena_used * self._slot
            self._arena_host[offset:offset + len(params)] = params
            self._arena_used += 1
            cp = self._pass or self._compute_pass()
            native = self._native
            if rec is None and native is not None:
                handle = self._pass_handle
                if pipe[1] is not self._pass_pipeline:  # runs of one kernel set it once
                    native[0](handle, pipe[3])
                    self._pass_pipeline = pipe[1]
                self._offset_arg[0] = offset
                native[1](handle, 0, bound[1], 1, self._offset_arg)
                if len(groups) == 2:
                    native[2](handle, groups[0], groups[1], 1)
                else:
                    native[2](handle, *groups)
            else:
                if pipe[1] is not self._pass_pipeline:
                    cp.set_pipeline(pipe[1])
                    self._pass_pipeline = pipe[1]
                cp.set_bind_group(0, bound[0], [offset])
                if rec is None:
                    cp.dispatch_workgroups(*groups)
                else:
                    rec.dispatch(self, cp, kspec, groups, flops, nbytes, t0)
            self._pending += 1
            self.num_dispatches += 1
            if self._pending >= self._threshold:
                self._flush_locked()
                t = self._threshold
                self._threshold = min(4 * t if t < _RAMP else 2 * t, CONFIG.submit_threshold)
            elif self._early_until:
                now = time.perf_counter()
                if now > self._early_until:
                    self._early_until = 0.0
                elif now - self._last_submit >= _EARLY_GAP_S:
                    self._flush_locked()
        finally:
            lock.release()

    def copy(self, src: wgpu.GPUBuffer, src_offset: int, dst: wgpu.GPUBuffer, dst_offset: int, nbytes: int) -> None:
        """Record a buffer-to-buffer copy (offsets and size multiples of 4)."""
        with self._lock:
            self._end_pass().copy_buffer_to_buffer(src, src_offset, dst, dst_offset, nbytes)
            self._pending += 1

    def _flush_locked(self) -> None:
        if self._encoder is None and self._pass is None:
            return
        track = self._ptrack
        try:
            encoder = self._end_pass()
            if track is not None:
                track.resolve(encoder)
            if self._arena_used:
                self.queue.write_buffer(self._arena, 0, memoryview(self._arena_host)[: self._arena_used * self._slot])
            self.queue.submit([encoder.finish()])
        except Exception as exc:
            # A finished (or broken) encoder accepts nothing more: keeping it would fail every later
            # op on this device. Its commands are lost; start a fresh stream and say so.
            lost = self._pending
            self._reset_stream()
            raise WgparError(f"{self}: submitting the {lost} operations recorded since the last submit failed, "
                             f"so they were discarded (tensors they were writing hold undefined values); "
                             f"the device stays usable. Cause: {exc}") from exc
        self.num_submits += 1
        self._last_submit = time.perf_counter()
        if track is not None:
            track.submitted()
        self._reset_stream()

    def _reset_stream(self) -> None:
        self._encoder = None
        self._pass = None
        self._pass_handle = None
        self._pass_pipeline = None
        self._pending = 0
        self._arena_used = 0

    def flush(self) -> None:
        """Submit everything recorded so far (does not wait for it)."""
        with self._lock:
            self._flush_locked()

    def _fence_and_wait(self) -> None:
        """Copy into the fence buffer at the end of the pending batch (or in a batch of its own when none is
        pending), submit, and wait until the GPU has done it: one submit where a flush and a fence took two
        (a submit costs the host 50-100 us on an H100)."""
        self._end_pass().copy_buffer_to_buffer(self._arena, 0, self._fence, 0, 16)
        self._flush_locked()
        # A map of a tiny buffer completes after all prior work: our fence (on_submitted_work_done is broken in
        # 0.32). Completed by our own polls, with a deadline, as a download's map: wgpu-py's map_sync waits
        # without one, through its poller thread (an idle synchronize took 220-460 us on an H100).
        _transfer.wait_promise(_transfer.map_async(self._fence, wgpu.MapMode.READ, 0, self._fence.size),
                               _UPLOAD_TIMEOUT, f"synchronize on {self}")
        self._fence.unmap()

    def synchronize(self) -> None:
        """Submit pending work and wait until the GPU has finished all of it."""
        with self._lock:
            self._fence_and_wait()
            self._idle()

    def _idle(self) -> None:
        """The host waited for the GPU, which is now idle: submit the next work early (on a GPU the first
        dispatch at once, then 4, 16 and doubling back to submit_threshold, and by time for _EARLY_S; on a
        CPU adapter after _RAMP, doubling), so the GPU is not left waiting while the host records a whole
        threshold's worth (GPT-2 under GradScaler, which reads a flag every step: the GPU idled about 30 ms
        a step while the optimizer and the next forward filled the first 512)."""
        if self._early:
            self._threshold = 1
            self._early_until = time.perf_counter() + _EARLY_S
        else:
            self._threshold = min(_RAMP, CONFIG.submit_threshold)

    # -- host transfers -------------------------------------------------------------------
    def upload(self, buffer: wgpu.GPUBuffer, offset: int, data: bytes | memoryview) -> None:
        """Copy host bytes (a multiple of 4) into ``buffer`` at ``offset``, in stream order."""
        nbytes = len(data) if not isinstance(data, memoryview) else data.nbytes
        with self._lock, _prof.span("upload", "transfer", bytes=nbytes, device=self.index):
            if nbytes >= _LARGE_UPLOAD:
                # A persistent mapped buffer: queue.write_buffer allocates fresh staging memory per
                # call, and first-touch page faults cost more than the PCIe copy (BENCHMARKS.md).
                self._upload_through_ring(buffer, offset, data, nbytes)
                return
            # write_buffer runs before still-unsubmitted work, which may read this (reused) buffer.
            self._flush_locked()
            self.queue.write_buffer(buffer, offset, data)

    def _upload_through_ring(self, buffer, offset: int, data, nbytes: int) -> None:
        ring = self._upload_ring
        if ring is None or ring.capacity < nbytes:
            capacity = max(nbytes, 2 * ring.capacity if ring else 0)
            self._upload_ring = ring = None  # drop the old ring: a retry after out-of-memory may need its memory
            ring = self._upload_ring = _transfer.UploadBuffer(self, capacity, "upload")
        target = ring.view(_UPLOAD_TIMEOUT, "upload")
        _transfer.host_copy(target, data)
        del target
        ring.commit(buffer, offset, nbytes)  # a GPU copy recorded in stream order, then submitted

    def _staging_buffer(self, size: int) -> wgpu.GPUBuffer:
        bucket = 1 << max(8, (size - 1).bit_length())
        if bucket > self.max_buffer:  # a power of two above a 1.5 GiB tensor exceeds max-buffer-size
            bucket = -(-size // 256) * 256
        buf = self._staging.get(bucket)
        if buf is None:
            buf = self.create_buffer("staging", bucket, wgpu.BufferUsage.MAP_READ | wgpu.BufferUsage.COPY_DST)
            self._staging[bucket] = buf
        return buf

    def download(self, buffer: wgpu.GPUBuffer, offset: int, nbytes: int) -> bytes:
        """Copy ``nbytes`` at ``offset`` (both multiples of 4) back to the host."""
        if nbytes == 0:
            return b""
        with self._lock, _prof.span("download", "transfer", bytes=nbytes, device=self.index):
            staging = self._staging_buffer(nbytes)
            self._end_pass().copy_buffer_to_buffer(buffer, offset, staging, 0, nbytes)
            self._flush_locked()
            with _prof.span("map wait", "transfer", bytes=nbytes, device=self.index):
                _transfer.wait_promise(_transfer.map_async(staging, wgpu.MapMode.READ, 0, staging.size),
                                       _UPLOAD_TIMEOUT, f"readback of {nbytes} bytes on {self}")
            self._idle()
            return _mapped_bytes(staging, nbytes)

    def read_later(self, buffer: wgpu.GPUBuffer, offset: int, nbytes: int) -> Readback:
        """Record a copy of ``nbytes`` (at most 256, offset a multiple of 4) into a buffer of its own, to
        be read by ``Readback.result()`` later: that waits only for the work recorded before this call,
        not for what the host records in between (``download`` waits for everything)."""
        if not 0 < nbytes <= _READBACK_BYTES or offset % 4 or nbytes % 4:
            raise ValueError(f"read_later: {nbytes} bytes at offset {offset}; at most {_READBACK_BYTES}, "
                             "both multiples of 4")
        with self._lock:
            staging = self._readbacks.pop() if self._readbacks else self.create_buffer(
                "readback", _READBACK_BYTES, wgpu.BufferUsage.MAP_READ | wgpu.BufferUsage.COPY_DST)
            self._end_pass().copy_buffer_to_buffer(buffer, offset, staging, 0, nbytes)
            self._pending += 1
            return Readback(self, staging, nbytes, self.num_submits)

    # -- stats ----------------------------------------------------------------------------
    def memory_stats(self) -> dict[str, int]:
        """This device's allocator counts (allocated_bytes, peak_allocated_bytes, reserved_bytes, ...); see
        ``wgpar.memory_stats``."""
        return self.allocator.stats()


class Readback:
    """A small copy that ``Device.read_later`` recorded: ``result()`` maps it (submitting it first if it
    still waits in the open command stream) and returns its bytes, cached after the first call."""

    def __init__(self, device: Device, staging: wgpu.GPUBuffer, nbytes: int, submits: int) -> None:
        self._device, self._staging, self._nbytes, self._submits = device, staging, nbytes, submits
        self._data: bytes | None = None

    def result(self) -> bytes:
        if self._data is None:
            dev = self._device
            with dev._lock:
                if dev.num_submits == self._submits:  # the copy is still in the open stream
                    dev._flush_locked()
                _transfer.wait_promise(_transfer.map_async(self._staging, wgpu.MapMode.READ, 0, _READBACK_BYTES),
                                       _UPLOAD_TIMEOUT, f"readback of {self._nbytes} bytes on {dev}")
                self._data = _mapped_bytes(self._staging, self._nbytes)
                dev._readbacks.append(self._staging)
        return self._data

    @property
    def done(self) -> bool:
        """Whether ``result()`` has been read already (it then returns at once)."""
        return self._data is not None

    def word(self) -> int:
        """The first 4 bytes as a little-endian unsigned int (a flag's value)."""
        return int.from_bytes(self.result()[:4], "little")


def _mapped_bytes(staging: wgpu.GPUBuffer, nbytes: int) -> bytes:
    """The first ``nbytes`` of a mapped staging buffer, which is unmapped after."""
    try:
        return bytes(staging.read_mapped(0, nbytes, copy=True))
    finally:
        staging.unmap()
