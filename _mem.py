import numpy as np, wgpar, time
from wgpar import nn, optim
from wgpar.nn import functional as F
from wgpar.distributed import MultiAdapterContext, PipelineExecutor
rng=np.random.default_rng(0)
H=32
def blocks(p):
    with wgpar.rng_stream(1):
        b=[]
        for s in range(p):
            b += [nn.Linear(H,H), nn.GELU(), nn.Linear(H,H)]
    return b
for p in (2,4):
  with MultiAdapterContext(p, timeout=30) as ctx:
    for sched in ("gpipe","1f1b","zb"):
        m=6
        X=rng.standard_normal((8*m,H)).astype(np.float32); Y=rng.standard_normal((8*m,H)).astype(np.float32)
        pipe=PipelineExecutor(blocks(p), ctx, m, sched, F.mse_loss)
        pipe.step(X,Y)
        base=[wgpar.memory_stats(d)["allocated_bytes"] for d in ctx.devices]
        for d in ctx.devices: wgpar.reset_peak_memory_stats(d)
        pipe.step(X,Y)
        peak=[wgpar.memory_stats(d)["peak_allocated_bytes"] for d in ctx.devices]
        print(sched, p, "base", base, "peak-base", [a-b for a,b in zip(peak,base)])
        for r,tr in enumerate(pipe.last_traces()):
            print("  rank",r, [(str(t.action), t.live, t.receives_posted, t.allocated_bytes-base[r]) for t in tr])
