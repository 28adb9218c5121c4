import numpy as np, wgpar, time, cProfile, pstats, threading, sys
from wgpar import nn, optim
from wgpar.nn import functional as F
from wgpar.distributed import MultiAdapterContext, PipelineExecutor
rng=np.random.default_rng(0)
H=8; p=2
ctx=MultiAdapterContext(p, timeout=30)
with wgpar.rng_stream(1):
    b=[nn.Linear(H,H) for _ in range(p)]
pipe=PipelineExecutor(b, ctx, 2, "1f1b", F.mse_loss)
opts=pipe.optimizers(lambda ps: optim.SGD(ps, lr=1e-3))
X=rng.standard_normal((4,H)).astype(np.float32)
for _ in range(3): pipe.train_step(X,X,opts)
threading.setprofile(None)
prof=cProfile.Profile()
# profile rank thread 0 work via wrapping
orig=pipe.ranks[0].step
def wrapped(*a, **k):
    prof.enable()
    try: return orig(*a, **k)
    finally: prof.disable()
pipe.ranks[0].step=wrapped
t=time.time()
for _ in range(30): pipe.train_step(X,X,opts)
print((time.time()-t)/30)
pstats.Stats(prof).sort_stats("cumulative").print_stats(25)
ctx.close()
