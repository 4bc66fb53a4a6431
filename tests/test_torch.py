"""polyfuse kernels as PyTorch operators (``polyfuse.torch``, issue 25): skipped without PyTorch.

On the CPU: a host kernel takes and returns CPU tensors (one output, or a tuple), the fake implementation gives
the outputs' shapes and dtypes (symbolic ones under dynamic shapes), ``torch.compile(fullgraph=True)`` traces a
call without a graph break, and an input that requires grad is refused. Marked ``gpu``: a CUDA kernel inside a
compiled function equals eager PyTorch on a non-default stream, and is captured by CUDA graphs.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from ir_programs import softmax_sum  # noqa: E402 - after the skip
from polyfuse import ops  # noqa: E402
from polyfuse.errors import LaunchError  # noqa: E402
from polyfuse.ir import ProgramBuilder  # noqa: E402
from polyfuse.ops.schedules import default_schedule  # noqa: E402
from polyfuse.pipeline import build  # noqa: E402
from polyfuse.torch import custom_op, output_shapes  # noqa: E402


def _expected(x):
    return torch.exp(x - x.amax(dim=1, keepdim=True)).sum(dim=1)


@pytest.fixture(scope="module")
def statistics():
    """The shifted exponential sum of each row (tests/ir_programs.py), sizes symbolic."""
    return custom_op(build(softmax_sum(), "cpp"))


def test_a_host_kernel_takes_and_returns_cpu_tensors(statistics):
    x = torch.randn(6, 33)
    xsum = statistics(x)
    assert isinstance(xsum, torch.Tensor) and xsum.device.type == "cpu" and xsum.dtype == torch.float32
    assert torch.allclose(xsum, _expected(x), rtol=1e-5)
    assert statistics(torch.randn(3, 5)).shape == (3,)  # sizes read off each call's input


def test_several_outputs_are_a_tuple():
    op = ops.get("rmsnorm_amax")
    sizes = op.sizes("default")
    norm = custom_op(build(default_schedule("rmsnorm_amax", "default", op.program("default", **sizes)), "cpp"))
    inputs = op.inputs(0, "default", sizes)
    y, amax = norm(torch.from_numpy(inputs["x"]))
    reference = op.reference(inputs, "default", sizes)
    result = ops.compare({"y": y.numpy(), "amax": amax.numpy()}, reference, op.tolerance("default", sizes))
    assert result.ok, result.line()
    assert str(norm.custom_op._opoverload._schema).endswith("(Tensor x) -> (Tensor, Tensor)")


def test_the_same_kernel_is_one_operator_and_its_schema_names_the_inputs(statistics):
    assert custom_op(statistics.kernel) is statistics
    assert str(statistics.custom_op._opoverload._schema).endswith("(Tensor inp) -> Tensor")
    with pytest.raises(LaunchError, match="is registered already, for another kernel or sizes"):
        custom_op(statistics.kernel, name=statistics.qualname.removeprefix("polyfuse::"), sizes={"N": 3})


def test_the_fake_implementation_gives_shapes_and_dtypes(statistics):
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        xsum = statistics(torch.empty(7, 12))
        assert (xsum.shape, xsum.dtype) == ((7,), torch.float32)
        with pytest.raises(LaunchError, match=r"input 'inp' has dtype torch.float64; expected torch.float32"):
            statistics(torch.empty(7, 12, dtype=torch.float64))
        with pytest.raises(LaunchError, match=r"input 'inp' has 1 dimension\(s\); expected 2"):
            statistics(torch.empty(7))
    torch.library.opcheck(statistics.custom_op._opoverload, (torch.randn(4, 9),))


def test_output_shapes_need_every_size():
    p = ProgramBuilder("broadcast")
    N, M = p.sizes("N", "M")
    x = p.input("x", (N,), "f32")
    y = p.output("y", (N, M), "f32")
    with p.nest("s", i=N, j=M) as (i, j):
        y[i, j] = x[i]
    kernel = build(p.build(), "cpp")
    with pytest.raises(LaunchError, match=r"the outputs' size\(s\) M are neither bound nor an input's dimension"):
        custom_op(kernel)
    op = custom_op(kernel, sizes={"M": 3})
    assert output_shapes(kernel, {"M": 3}, [torch.empty(5)]) == [(5, 3)]
    assert torch.equal(op(torch.arange(5.0)), torch.arange(5.0)[:, None].expand(5, 3))


@pytest.mark.parametrize("dynamic", [False, True])
def test_torch_compile_traces_it_in_one_graph(statistics, dynamic):
    def f(x):
        y = x * 2.0
        return y.amax(dim=1) + torch.log(statistics(y))

    compiled = torch.compile(f, fullgraph=True, dynamic=dynamic, backend="aot_eager")
    for shape in ((6, 33), (9, 17)):
        x = torch.randn(*shape)
        assert torch.allclose(compiled(x), torch.logsumexp(2.0 * x, dim=1), rtol=1e-5)
    assert torch._dynamo.explain(f)(torch.randn(6, 33)).graph_break_count == 0


def test_an_input_that_requires_grad_is_refused(statistics):
    x = torch.randn(4, 9, requires_grad=True)
    with pytest.raises(LaunchError, match=r"is forward only: input 'inp' requires grad.*torch.no_grad\(\)"):
        statistics(x)
    with torch.no_grad():
        assert torch.allclose(statistics(x), _expected(x.detach()), rtol=1e-5)
    with pytest.raises(LaunchError, match=r"takes 1 tensor\(s\) \(inp\); got 2"):
        statistics(x.detach(), x.detach())


# ------------------------------------------------------------------ on the GPU

def _cuda_softmax(N: int = 64, M: int = 1000):
    op = ops.get("softmax")
    program = op.program("default", N=N, M=M)
    return custom_op(build(default_schedule("softmax", "default", program, target="cuda"), "cuda"))


@pytest.mark.gpu
def test_compiled_with_a_polyfuse_kernel_equals_eager_on_a_side_stream(monkeypatch):
    softmax = _cuda_softmax()
    streams = []
    launch = softmax.kernel.launch
    monkeypatch.setattr(softmax.kernel, "launch", lambda arrays, sizes, stream=0: (streams.append(stream),
                                                                                  launch(arrays, sizes, stream))[1])

    def f(x):
        return softmax(x * 2.0) * 3.0 + 1.0

    compiled = torch.compile(f, fullgraph=True)
    x = torch.randn(64, 1000, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        big = torch.randn(4096, 4096, device="cuda")
        for _ in range(8):  # keep the side stream busy: a launch on another stream would read x too early
            big = big @ big / 64.0
        y = x + (big[:64, :1000] * 0.0).nan_to_num(0.0)
        got = compiled(y)
        expected = torch.softmax(y * 2.0, dim=1) * 3.0 + 1.0
    torch.cuda.synchronize()
    assert torch.allclose(got, expected, rtol=1e-5, atol=1e-6)
    assert streams and set(streams) == {side.cuda_stream}
    assert torch._dynamo.explain(f)(x).graph_break_count == 0


@pytest.mark.gpu
def test_cuda_graphs_capture_the_kernel():
    softmax = _cuda_softmax()
    x = torch.randn(64, 1000, device="cuda")
    warm = torch.cuda.Stream()
    warm.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(warm):
        softmax(x)
    torch.cuda.current_stream().wait_stream(warm)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = softmax(x) * 2.0
    fresh = torch.randn(64, 1000, device="cuda")
    x.copy_(fresh)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.allclose(y, torch.softmax(fresh, dim=1) * 2.0, rtol=1e-5, atol=1e-6)


@pytest.mark.gpu
def test_torch_compile_reduce_overhead_runs_it_in_cuda_graphs():
    softmax = _cuda_softmax()
    compiled = torch.compile(lambda x: softmax(x) + 1.0, fullgraph=True, mode="reduce-overhead")
    for seed in range(3):
        x = torch.randn(64, 1000, device="cuda", generator=torch.Generator("cuda").manual_seed(seed))
        assert torch.allclose(compiled(x).clone(), torch.softmax(x, dim=1) + 1.0, rtol=1e-5, atol=1e-6)


@pytest.mark.gpu
def test_decode_attention_with_scratch_under_torch_compile():
    # Decode splits the keys between a partial and a combine kernel through scratch buffers, allocated at the
    # first call; f16 inputs and output.
    op = ops.get("attn_causal")
    sizes = op.sizes("decode", {"Skv": 2048})
    attention = custom_op(build(default_schedule("attn_causal", "decode", op.program("decode", **sizes),
                                                 target="cuda"), "cuda"))
    inputs = op.inputs(0, "decode", sizes)
    tensors = [torch.from_numpy(inputs[a.name]).cuda() for a in attention.kernel.inputs]
    compiled = torch.compile(lambda *ts: attention(*ts).float(), fullgraph=True)
    got = compiled(*tensors).cpu().numpy()
    reference = op.reference(inputs, "decode", sizes)["out"]
    assert ops.compare({"out": got}, {"out": reference}, op.tolerance("decode", sizes)).ok


@pytest.mark.gpu
def test_tensors_on_a_second_gpu_run_there():
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two CUDA GPUs")
    softmax = _cuda_softmax()
    x = torch.randn(64, 1000, device="cuda:1")
    y = softmax(x)
    torch.cuda.synchronize("cuda:1")
    assert y.device == x.device and torch.allclose(y, torch.softmax(x, dim=1), rtol=1e-5, atol=1e-6)
    assert np.isfinite(y.cpu().numpy()).all()
