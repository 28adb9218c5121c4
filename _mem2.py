import numpy as np, wgpar, time
from wgpar import nn, optim
from wgpar.nn import functional as F
from wgpar.distributed import MultiAdapterContext, PipelineExecutor
rng=np.random.default_rng(0)
H=8
for p in (2,4):
  with MultiAdapterContext(p, timeout=30) as ctx:
    with wgpar.rng_stream(1):
        b=[nn.Linear(H,H) for _ in range(p)]
    pipe=PipelineExecutor(b, ctx, 2, "zb", F.mse_loss)
    opts=pipe.optimizers(lambda ps: optim.AdamW(ps, lr=1e-3))
    X=rng.standard_normal((4,H)).astype(np.float32)
    for _ in range(3): pipe.train_step(X,X,opts)
    t=time.time()
    for _ in range(50): pipe.train_step(X,X,opts)
    print(p, (time.time()-t)/50)
