"""Module forward pre-hooks and forward hooks behave as torch.nn.Module's.

Each scenario runs on a wgpar Module and its log and result are checked against torch's documented
behaviour, written out in the test: ordering, prepend, replaced args and outputs, kwargs, removal (also
while the hooks run) and exceptions. In the torch run the same scenario also runs on a torch Module and
must leave the same log and result.
"""

from __future__ import annotations

import numpy as np
import pytest

import wgpar
from wgpar import nn

from .helpers import assert_close


def echo_class(base):
    class Echo(base):
        def __init__(self, log):
            super().__init__()
            self.log = log

        def forward(self, *args, **kwargs):
            self.log.append(("forward", args, kwargs))
            return ("out", args, tuple(sorted(kwargs.items())))

    return Echo


def run_both(scenario, torch):
    """The scenario's (log, result) on wgpar and, with ``torch``, on torch too: they must be equal."""
    got = {}
    bases = {"wgpar": nn.Module} if torch is None else {"wgpar": nn.Module, "torch": torch.nn.Module}
    for name, base in bases.items():
        log: list = []
        try:
            result = scenario(echo_class(base)(log), log)
        except Exception as exc:  # the exception (type and whether it came) is part of the behaviour
            result = ("raised", type(exc).__name__)
        got[name] = (log, result)
    assert got["wgpar"] == got.get("torch", got["wgpar"])
    return got["wgpar"]


def test_hooks_run_in_registration_order_with_prepend(reference):
    def scenario(m, log):
        def pre(tag):
            return lambda mod, args: log.append(("pre", tag, args))

        def post(tag):
            return lambda mod, args, out: log.append(("post", tag, args, out[0]))

        m.register_forward_pre_hook(pre("a"))
        m.register_forward_pre_hook(pre("b"))
        m.register_forward_pre_hook(pre("first"), prepend=True)
        m.register_forward_hook(post("x"))
        m.register_forward_hook(post("y"))
        m.register_forward_hook(post("first"), prepend=True)
        return m(1, 2)

    log, result = run_both(scenario, reference)
    assert [e[1] if e[0] != "forward" else "fwd" for e in log] == ["first", "a", "b", "fwd", "first", "x", "y"]
    assert result == ("out", (1, 2), ())


def test_pre_hooks_replace_args_and_forward_hooks_replace_the_output(reference):
    def scenario(m, log):
        m.register_forward_pre_hook(lambda mod, args: None)  # unchanged
        m.register_forward_pre_hook(lambda mod, args: args[0] * 10)  # non-tuple: wrapped in a tuple
        m.register_forward_pre_hook(lambda mod, args: (args[0] + 1, "extra"))
        m.register_forward_hook(lambda mod, args, out: log.append(("post-args", args)))
        m.register_forward_hook(lambda mod, args, out: ("replaced", out))
        m.register_forward_hook(lambda mod, args, out: log.append(("sees", out[0])))
        return m(4, 5, k=6)

    log, result = run_both(scenario, reference)
    assert log[0] == ("forward", (41, "extra"), {"k": 6})
    assert ("post-args", (41, "extra")) in log and ("sees", "replaced") in log
    assert result == ("replaced", ("out", (41, "extra"), (("k", 6),)))


def test_with_kwargs_hooks(reference):
    def scenario(m, log):
        m.register_forward_pre_hook(lambda mod, args, kwargs: (args + (7,), {**kwargs, "added": True}),
                                    with_kwargs=True)
        m.register_forward_hook(lambda mod, args, kwargs, out: log.append(("post", args, kwargs)),
                                with_kwargs=True)
        return m(1, k=2)

    log, result = run_both(scenario, reference)
    assert log == [("forward", (1, 7), {"k": 2, "added": True}), ("post", (1, 7), {"k": 2, "added": True})]
    assert result == ("out", (1, 7), (("added", True), ("k", 2)))

    def bad_return(m, log):
        m.register_forward_pre_hook(lambda mod, args, kwargs: args, with_kwargs=True)
        return m(1, 2, 3)

    log, result = run_both(bad_return, reference)
    assert result == ("raised", "RuntimeError") and log == []


def test_remove_handles_also_while_hooks_run(reference):
    def scenario(m, log):
        handles = {}

        def a(mod, args):
            log.append("a")
            handles["a"].remove()  # itself
            handles["b"].remove()  # a later one: still runs in this call (snapshot), not after
            handles["b"].remove()  # twice is fine

        handles["a"] = m.register_forward_pre_hook(a)
        handles["b"] = m.register_forward_pre_hook(lambda mod, args: log.append("b"))
        m.register_forward_pre_hook(lambda mod, args: log.append("c"))
        hx = m.register_forward_hook(lambda mod, args, out: log.append("x"))
        m(1)
        hx.remove()
        m(2)
        with m.register_forward_hook(lambda mod, args, out: log.append("ctx")):
            m(3)
        m(4)
        return None

    log, _ = run_both(scenario, reference)
    order = [e if isinstance(e, str) else e[1] for e in log]
    assert order == ["a", "b", "c", (1,), "x", "c", (2,), "c", (3,), "ctx", "c", (4,)]


@pytest.mark.parametrize("where", ["pre", "forward", "post"])
def test_exceptions_propagate_and_leave_the_module_usable(where, reference):
    def scenario(m, log):
        def boom(*a):
            raise ValueError(f"boom in {where}")

        h = None
        if where == "pre":
            h = m.register_forward_pre_hook(boom)
        m.register_forward_pre_hook(lambda mod, args: log.append("pre-after"))
        m.register_forward_hook(lambda mod, args, out: log.append("post"))
        if where == "post":
            h = m.register_forward_hook(boom)
        m.register_forward_hook(lambda mod, args, out: log.append("post-after"))
        if where == "forward":
            m.forward = boom  # an instance attribute: __call__ looks it up per call
        try:
            m(1)
        except ValueError as exc:
            log.append(("caught", str(exc)))
        if h is not None:
            h.remove()
        else:
            del m.forward
        return m(2)[1]

    log, result = run_both(scenario, reference)
    assert result == (2,)
    caught = ("caught", f"boom in {where}")
    first = {"pre": [caught], "forward": ["pre-after", caught],
             "post": ["pre-after", ("forward", (1,), {}), "post", caught]}[where]  # later hooks never ran
    assert log == first + ["pre-after", ("forward", (2,), {}), "post", "post-after"]


def test_hooks_belong_to_one_module_and_run_for_children():
    calls = []
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    other = nn.Linear(3, 4)
    for name, m in model.named_modules():
        m.register_forward_pre_hook(lambda mod, args, name=name: calls.append(("pre", name)))
        m.register_forward_hook(lambda mod, args, out, name=name: calls.append(("post", name)))
    model(wgpar.ones(5, 3))
    other(wgpar.ones(5, 3))
    assert calls == [("pre", ""), ("pre", "0"), ("post", "0"), ("pre", "1"), ("post", "1"),
                     ("pre", "2"), ("post", "2"), ("post", "")]


def test_hooks_change_tensors_and_gradients_flow(rng):
    """The FSDP shape of use: a pre-hook supplies what forward reads, a post-hook edits the output."""
    x = rng.standard_normal((5, 3)).astype(np.float32)
    lin = nn.Linear(3, 4)
    w, b = lin.weight.numpy().astype(np.float64), lin.bias.numpy().astype(np.float64)
    lin.register_forward_pre_hook(lambda mod, args: args[0] * 2.0)
    lin.register_forward_hook(lambda mod, args, out: out + 1.0)
    xt = wgpar.tensor(x, requires_grad=True)
    y = lin(xt)
    assert_close(y.numpy(), (2 * x) @ w.T + b + 1, rtol=1e-5, atol=1e-5)
    y.sum().backward()
    assert_close(xt.grad.numpy(), np.tile(2 * w.sum(0), (5, 1)), rtol=1e-5, atol=1e-5)
    assert_close(lin.weight.grad.numpy(), np.tile((2 * x).sum(0), (4, 1)), rtol=1e-5, atol=1e-5)
