"""Per-op cost of a chain of small elementwise ops: wgpar against raw wgpu-py.

wgpar runs ``x = x * 1.0001 + 0.5`` until ``--ops`` kernels have been
issued; the baseline records the same number of dispatches of one WGSL kernel
(``y = x * a + b``, ping-ponging two buffers through two prebuilt bind groups)
into ONE compute pass of one encoder and submits it. Both times include
waiting for the GPU to finish. The ratio is the overhead wgpar's Python
dispatch path adds per op (target: at most 3x).

    python benchmarks/bench_ops.py --sizes 1024 --ops 1000 --repeat 5
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import wgpu  # noqa: E402

import wgpar  # noqa: E402
from benchmarks import _report  # noqa: E402

_RAW_WGSL = """
@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read_write> y: array<f32>;
struct P { n: u32, a: f32, b: f32, _p: u32 }
@group(0) @binding(2) var<uniform> p: P;
@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
  let i = gid.x;
  if (i >= p.n) { return; }
  y[i] = x[i] * p.a + p.b;
}
"""


class RawChain:
    """The same dispatches through raw wgpu-py: one pipeline, prebuilt bind groups, one pass."""

    def __init__(self, dev: wgpu.GPUDevice, n: int) -> None:
        self.dev, self.n = dev, n
        usage = wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_DST | wgpu.BufferUsage.COPY_SRC
        bufs = [dev.create_buffer_with_data(data=np.ones(n, np.float32).tobytes(), usage=usage) for _ in range(2)]
        params = dev.create_buffer_with_data(
            data=np.array([n], np.uint32).tobytes() + np.array([1.0001, 0.5, 0], np.float32).tobytes(),
            usage=wgpu.BufferUsage.UNIFORM)
        module = dev.create_shader_module(code=_RAW_WGSL)
        self.pipeline = dev.create_compute_pipeline(layout="auto", compute={"module": module, "entry_point": "main"})
        layout = self.pipeline.get_bind_group_layout(0)
        self.groups = [
            dev.create_bind_group(layout=layout, entries=[
                {"binding": 0, "resource": {"buffer": bufs[i], "offset": 0, "size": bufs[i].size}},
                {"binding": 1, "resource": {"buffer": bufs[1 - i], "offset": 0, "size": bufs[1 - i].size}},
                {"binding": 2, "resource": {"buffer": params, "offset": 0, "size": 16}}])
            for i in range(2)]
        self.src = bufs[0]
        self.fence = dev.create_buffer(size=16, usage=wgpu.BufferUsage.MAP_READ | wgpu.BufferUsage.COPY_DST)

    def run(self, ops: int) -> None:
        enc = self.dev.create_command_encoder()
        cp = enc.begin_compute_pass()
        nwg = -(-self.n // 256)
        for i in range(ops):
            cp.set_pipeline(self.pipeline)
            cp.set_bind_group(0, self.groups[i & 1])
            cp.dispatch_workgroups(nwg)
        cp.end()
        enc.copy_buffer_to_buffer(self.src, 0, self.fence, 0, 16)
        self.dev.queue.submit([enc.finish()])
        self.fence.map_sync(wgpu.MapMode.READ)  # waits for the GPU: the same fence wgpar uses
        self.fence.unmap()


def wgpar_chain(x: wgpar.Tensor, ops: int, sync: bool = True) -> wgpar.Tensor:
    for _ in range(ops // 2):
        x = x * 1.0001 + 0.5
    if ops % 2:
        x = x * 1.0001
    if sync:
        wgpar.synchronize(x.device)
    return x


def host_only(x: wgpar.Tensor, ops: int, repeat: int) -> float:
    """Median seconds to record the chain (Python + wgpu-py calls), the GPU wait excluded."""
    times = []
    for _ in range(repeat):
        wgpar.synchronize(x.device)
        t0 = time.perf_counter()
        wgpar_chain(x, ops, sync=False)
        times.append(time.perf_counter() - t0)
    wgpar.synchronize(x.device)
    return statistics.median(times)


def best_of(fn, repeat: int) -> tuple[float, float]:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times), statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=[1024], help="tensor sizes (elements)")
    ap.add_argument("--ops", type=int, default=1000, help="ops per chain")
    ap.add_argument("--repeat", type=int, default=5, help="timed chains per size (best and median reported)")
    ap.add_argument("--device", type=int, default=0, help="wgpar device index")
    _report.add_report_flags(ap)
    args = ap.parse_args(argv)

    dev = wgpar.device(args.device)
    print(f"device: {_report.device_line(dev)}")
    rows = []
    for n in args.sizes:
        x = wgpar.tensor(np.ones(n, np.float32), device=dev)
        raw = RawChain(dev._dev, n)
        wgpar_chain(x, args.ops)  # warm-up: pipelines, bind groups, allocator cache
        raw.run(args.ops)
        w_best, w_med = best_of(lambda x=x: wgpar_chain(x, args.ops), args.repeat)
        r_best, r_med = best_of(lambda raw=raw: raw.run(args.ops), args.repeat)
        host = host_only(x, args.ops, args.repeat) / args.ops * 1e6
        check = wgpar_chain(x, 2).numpy()
        assert np.allclose(check, np.ones(n) * 1.0001 + 0.5, rtol=1e-5), "wgpar chain computed wrong values"
        per_w, per_r = w_med / args.ops * 1e6, r_med / args.ops * 1e6
        ratio = w_med / r_med
        rows.append([f"{n}", f"{args.ops}", f"{per_w:.1f}", f"{host:.1f}", f"{per_r:.1f}", f"{ratio:.2f}x",
                     "yes" if ratio <= 3 else "NO"])
        print(f"n={n:>8} ops={args.ops}: wgpar {per_w:8.1f} us/op (best {w_best / args.ops * 1e6:.1f})  "
              f"(host only {host:.1f})  raw wgpu {per_r:8.1f} us/op (best {r_best / args.ops * 1e6:.1f})  "
              f"ratio {ratio:.2f}x")
    table = _report.markdown_table(
        ["elements", "ops", "wgpar us/op", "of which recording (host)", "raw wgpu-py us/op (one pass)", "ratio",
         "<= 3x"], rows)
    print(table)
    slug = _report.slug(dev.adapter_name)
    body = (f"## Elementwise chain: per-op cost vs raw wgpu-py ({dev.adapter_name})\n\n"
            f"- device: {_report.device_line(dev)}\n- date: {_report.today()}\n"
            f"- command: `{_report.command_line()}`\n"
            f"- what: `x = x * 1.0001 + 0.5` repeated to {args.ops} kernels, then synchronize; baseline: "
            f"{args.ops} dispatches of one WGSL kernel with prebuilt bind groups in one compute pass, "
            f"then the same fence wait. Median of {args.repeat} chains, same process.\n\n{table}\n")
    _report.finish(args, f"ops:{slug}", body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
