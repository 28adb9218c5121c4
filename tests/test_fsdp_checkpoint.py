"""Full and sharded state dicts; a sharded checkpoint saved on 4 ranks continues on 2 ranks and on 1."""

from __future__ import annotations

import numpy as np
import pytest

import wgpar
from wgpar.distributed import FSDP, MultiAdapterContext
from wgpar.distributed.fsdp import HostAdamW, OffloadPolicy, load_sharded_checkpoint, sharded_state_dict
from wgpar.nn import functional as F

from .fsdp_models import OPTS, make_net, max_rel

pytestmark = pytest.mark.multidevice


def test_full_and_sharded_state_dicts(rng):
    seed = int(rng.integers(1 << 30))
    want = {k: v.numpy() for k, v in make_net(seed).state_dict().items()}
    with MultiAdapterContext(4, timeout=60) as ctx:
        fsdp = FSDP(make_net(seed), ctx, persist_threshold=0)
        full = fsdp.full_state_dict()
        shards = ctx.run(lambda r: sharded_state_dict(fsdp.modules[r]))
    assert sorted(full) == sorted(want)
    for k, w in want.items():
        np.testing.assert_array_equal(full[k], w, err_msg=k)
        rows = [s[k] for s in shards]
        assert [r.rows for r in rows] == sorted(r.rows for r in rows) and rows[0].shape == w.shape
        joined = np.concatenate([r.data for r in rows]) if w.ndim else rows[0].data
        np.testing.assert_array_equal(joined.reshape(w.shape), w, err_msg=k)
    plain = make_net(seed + 1)
    plain.load_state_dict(full)  # the names and shapes of the unsharded model
    for k, v in plain.state_dict().items():
        np.testing.assert_array_equal(v.numpy(), want[k])


def _train(fsdp: FSDP, opts, X, Y, steps: int) -> list[float]:
    return [fsdp.train_step(X[k], Y[k], F.cross_entropy, opts).item() for k in range(steps)]


def test_sharded_checkpoint_saved_on_4_ranks_continues_on_2_and_on_1(rng, tmp_path):
    seed = int(rng.integers(1 << 30))
    X = rng.standard_normal((6, 10, 6)).astype(np.float32)
    Y = rng.integers(0, 3, (6, 10)).astype(np.int32)
    with MultiAdapterContext(4, timeout=60) as ctx:
        fsdp = FSDP(make_net(seed), ctx, persist_threshold=0)
        opts = fsdp.optimizers(OPTS["adamw"])
        _train(fsdp, opts, X, Y, 3)
        fsdp.save_checkpoint(tmp_path, opts)
        want_losses = _train(fsdp, opts, X[3:], Y[3:], 3)
        want = fsdp.full_state_dict()
        del fsdp, opts
    assert sorted(p.name for p in tmp_path.iterdir()) == ["index.json"] + [f"rank{r:05d}-of-00004.safetensors"
                                                                          for r in range(4)]
    # 2 ranks, shards and AdamW's state offloaded to the host: other rows, other layout, same training.
    with MultiAdapterContext(2, timeout=60) as ctx:
        fsdp = FSDP(make_net(seed + 1), ctx, persist_threshold=0, offload_policy=OffloadPolicy())
        opts = fsdp.optimizers(lambda ps: HostAdamW(ps, lr=0.5, eps=1e-4))  # hyperparameters come from the file
        fsdp.load_checkpoint(tmp_path, opts)
        assert opts[0].param_groups[0]["lr"] == 0.01
        losses = _train(fsdp, opts, X[3:], Y[3:], 3)
        got = fsdp.full_state_dict()
    assert max_rel(losses, want_losses) < 1e-5, (losses, want_losses)
    for k, w in want.items():
        assert max_rel(got[k], w) < 1e-5, k
    # 1 device, no FSDP at all: the plain model and optimizer read every rank's rows.
    model = make_net(seed + 2)
    opt = OPTS["adamw"](model.parameters())
    load_sharded_checkpoint(model, tmp_path, opt)
    losses = []
    for k in range(3, 6):
        opt.zero_grad()
        loss = F.cross_entropy(model(wgpar.tensor(X[k])), Y[k])
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert max_rel(losses, want_losses) < 1e-5, (losses, want_losses)
    for k, v in model.state_dict().items():
        assert max_rel(v.numpy(), want[k]) < 1e-5, k


def test_loading_a_checkpoint_of_another_model_names_what_differs(rng, tmp_path):
    with MultiAdapterContext(2, timeout=60) as ctx:
        fsdp = FSDP(make_net(1), ctx, persist_threshold=0)
        fsdp.save_checkpoint(tmp_path)
    other = make_net(2)
    other.head = wgpar.nn.Linear(34, 4)
    with pytest.raises(ValueError, match=r"'head.weight' has shape \(3, 34\) in the checkpoint but \(4, 34\)"):
        load_sharded_checkpoint(other, tmp_path)
    (tmp_path / "rank00001-of-00002.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="rank00001-of-00002.safetensors is missing"):
        load_sharded_checkpoint(make_net(3), tmp_path)
