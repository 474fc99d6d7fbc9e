"""Programmatic dependent launch (`triton_support.jit(dependent=True)`).

On any machine: a kernel declared dependent must take PDL last and call `after_upstream(PDL)` first, or its
decoration fails; the decode path's kernels are declared so; PDL is off in the interpreter and under
ISOEXEC_PDL=0. On a Hopper GPU: launched with PDL, a kernel's code waits on the kernel ahead (griddepcontrol in
its PTX, launch_pdl in its launch) and without it does not; a chain of dependent kernels captured in a CUDA
graph, each reading what the one ahead wrote, gives the same bits with PDL as without, while the same
comparison sees a changed eps; and a decode graph's log-prob rows are the same bits either way.
"""

import os
import pathlib
import subprocess
import sys
import textwrap

import pytest
import torch

from conftest import ON_GPU, require_triton

require_triton()

from isoexec.ops import triton_support  # noqa: E402
from isoexec.ops.activation import triton as activation_triton  # noqa: E402
from isoexec.ops.attention import triton as attention_triton  # noqa: E402
from isoexec.ops.attention import triton_blocks  # noqa: E402
from isoexec.ops.gdn import conv_triton as gdn_conv_triton  # noqa: E402
from isoexec.ops.gdn import triton as gdn_triton  # noqa: E402
from isoexec.ops.linear import persistent_triton, row_parallel_triton, swapped_triton  # noqa: E402
from isoexec.ops.logprobs import triton as logprobs_triton  # noqa: E402
from isoexec.ops.rms_norm import triton as rms_norm_triton  # noqa: E402
from isoexec.ops.rope import qk_triton  # noqa: E402
from isoexec.ops.sampling import triton as sampling_triton  # noqa: E402
from isoexec.ops.triton_support import after_upstream, jit, tl  # noqa: E402

pytestmark = pytest.mark.gpu

HOPPER = ON_GPU and torch.cuda.get_device_capability() >= (9, 0)

DECODE_KERNELS = [
    swapped_triton.linear_swapped_kernel, persistent_triton.linear_persistent_kernel, row_parallel_triton.fused_kernel,
    attention_triton.attention_fwd_kernel, triton_blocks.block_max_kernel, triton_blocks.fold_kernel,
    rms_norm_triton.rms_norm_fwd_kernel, qk_triton.qk_norm_rope_kernel,
    activation_triton.silu_mul_fwd_kernel, logprobs_triton.chunk_max_kernel,
    logprobs_triton.chunk_sum_kernel, logprobs_triton.chunk_write_kernel,
    sampling_triton.segment_max_kernel, sampling_triton.sample_kernel, sampling_triton.pick_kernel,
    gdn_conv_triton.gdn_conv_kernel, gdn_conv_triton.gdn_conv_state_kernel,
]


def test_a_dependent_kernel_waits_first():
    def waits(x, PDL: tl.constexpr = False):
        """A docstring may come first."""
        after_upstream(PDL)
        tl.store(x, 1)

    jit(waits, dependent=True)

    def computes_first(x, PDL: tl.constexpr = False):
        o = tl.arange(0, 64)  # noqa: F841  (any statement before the wait is what the check must refuse)
        after_upstream(PDL)

    def loads_first(x, PDL: tl.constexpr = False):
        y = tl.load(x)
        after_upstream(PDL)
        tl.store(x, y)

    def no_flag(x):
        after_upstream(False)

    def flag_on_by_default(x, PDL: tl.constexpr = True):
        after_upstream(PDL)

    for fn in (loads_first, no_flag, flag_on_by_default, computes_first):
        with pytest.raises(TypeError, match="dependent kernel"):
            jit(fn, dependent=True)
    jit(loads_first)  # not declared dependent: never launched with PDL, so nothing to check


def test_the_decode_path_is_dependent():
    """Every kernel of a dense model's decode step (the walk's attention or its spread path, the sampler's, and a hybrid
    model's Gated DeltaNet conv) declares itself dependent; the check at decoration is what keeps each of them waiting
    before it touches memory. Two do not, each slower launched so: the Gated DeltaNet core (gdn/triton.py) and the
    spread path's terms kernel (attention/triton_blocks.py)."""
    for kernel in DECODE_KERNELS:
        assert kernel.arg_names[-1] == "PDL", kernel
        if not triton_support.interpreting():
            assert kernel.dependent_launches is triton_support.dependent_launches
    assert "PDL" not in gdn_triton.gdn_fwd_kernel.arg_names
    assert "PDL" not in triton_blocks.block_terms_kernel.arg_names


def test_off_in_the_interpreter_and_when_turned_off(monkeypatch):
    triton_support.dependent_launches.cache_clear()
    try:
        monkeypatch.setenv(triton_support.PDL_ENV, "0")
        assert not triton_support.dependent_launches(0)
        if triton_support.interpreting() or not ON_GPU:
            monkeypatch.delenv(triton_support.PDL_ENV)
            assert not triton_support.dependent_launches(0)
    finally:
        triton_support.dependent_launches.cache_clear()


PTXAS = pathlib.Path(triton_support.triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"


@pytest.mark.skipif(not PTXAS.exists(), reason="needs Triton's ptxas")
def test_for_hopper_the_wait_comes_before_every_memory_access(tmp_path):
    """rms_norm.triton's kernel (a residual, so it loads and stores) compiled for sm_90 as a launch with PDL
    specialises it: griddepcontrol.wait, then launch_dependents, before the first global load or store;
    compiled without PDL (the control), neither instruction is there."""
    script = textwrap.dedent("""
        import re, triton
        from triton.backends.compiler import GPUTarget
        from triton.compiler import ASTSource
        from isoexec.ops.rms_norm import triton as norm

        def ptx(pdl):
            kernel = norm.rms_norm_fwd_kernel
            constexprs = dict(H=4096, NH=4, HAS_RESIDUAL=True, ZERO_CENTERED=False, REDUCE_BLOCK=1024, PDL=pdl)
            types = {name: "constexpr" if name in constexprs else "*bf16" if name in "xrwys" else "fp32" if name == "eps" else "i32"
                     for name in kernel.arg_names}
            source = ASTSource(kernel, types, constexprs=constexprs, attrs={})
            options = {"num_warps": 4, "enable_fp_fusion": False, "launch_pdl": pdl}
            return triton.compile(source, target=GPUTarget("cuda", 90, 32), options=options).asm["ptx"]

        def first(text, pattern):
            found = re.search(pattern, text, re.M)
            return found.start() if found else None

        with_pdl, without = ptx(True), ptx(False)
        memory = r"^\\s*(?:@%p\\d+\\s+)?(?:ld|st)\\.global"
        wait, release = first(with_pdl, r"griddepcontrol\\.wait"), first(with_pdl, r"griddepcontrol\\.launch_dependents")
        assert wait is not None and release is not None and wait < release < first(with_pdl, memory), (wait, release)
        assert "griddepcontrol" not in without and first(without, memory) is not None
    """)
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"} | {"TRITON_CACHE_DIR": str(tmp_path)}
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 0, result.stderr[-3000:]


def _with_pdl(on: bool):
    os.environ[triton_support.PDL_ENV] = "1" if on else "0"
    triton_support.dependent_launches.cache_clear()


@pytest.fixture
def pdl_switch():
    saved = os.environ.get(triton_support.PDL_ENV)
    yield _with_pdl
    if saved is None:
        os.environ.pop(triton_support.PDL_ENV, None)
    else:
        os.environ[triton_support.PDL_ENV] = saved
    triton_support.dependent_launches.cache_clear()


def _chain(x, residual, weight, eps):
    """Forty norms, each reading the output and sum the one before wrote, and a SiLU-and-multiply after each."""
    for _ in range(40):
        y, residual = rms_norm_triton.rms_norm_fwd(x, residual, weight, eps, False, torch.bfloat16, reduce_block=1024, num_warps=4)
        x = activation_triton.silu_mul_fwd(y, residual, torch.bfloat16)
    return x, residual


@pytest.mark.skipif(not HOPPER, reason="programmatic dependent launch needs sm_90 or later")
def test_a_chain_in_a_graph_has_the_same_bits_with_pdl(pdl_switch):
    g = torch.Generator().manual_seed(0)
    x, residual = (torch.randn(64, 4096, generator=g).bfloat16().cuda() for _ in range(2))
    weight = torch.randn(4096, generator=g).bfloat16().cuda()
    outputs = {}
    for on, eps in ((True, 1e-6), (False, 1e-6), (False, 1e-5)):
        pdl_switch(on)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            _chain(x, residual, weight, eps)  # compiles outside the capture
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = _chain(x, residual, weight, eps)
        for _ in range(3):
            graph.replay()
        torch.cuda.synchronize()
        outputs[(on, eps)] = [t.clone().view(torch.int16) for t in out]
        compiled = [k for k in rms_norm_triton.rms_norm_fwd_kernel.launches.values() if k.metadata.launch_pdl == on]
        assert compiled and all(("griddepcontrol.wait" in k.asm["ptx"]) == on for k in compiled)
    same = all(torch.equal(a, b) for a, b in zip(outputs[(True, 1e-6)], outputs[(False, 1e-6)]))
    control = all(torch.equal(a, b) for a, b in zip(outputs[(False, 1e-6)], outputs[(False, 1e-5)]))
    assert same and not control


@pytest.mark.skipif(not HOPPER, reason="programmatic dependent launch needs sm_90 or later")
def test_decode_graph_rows_have_the_same_bits_with_pdl(pdl_switch):
    from isoexec.contract import fit_contract, load
    from isoexec.engine import EngineConfig, LLMEngine, SamplingParams
    from isoexec.model import PRESETS, init_random

    model = init_random(PRESETS["qwen3-0.6b-random"], seed=0).cuda()
    contract = fit_contract(load("tiny-dense-triton"), model.spec, device="cuda")
    ids = torch.randint(0, 1000, (5,), generator=torch.Generator().manual_seed(0)).cuda()
    positions = torch.full((5,), 40, dtype=torch.int64, device="cuda")
    slot_table = torch.arange(5 * 64, device="cuda").reshape(5, 64)
    rows = {}
    for on in (True, False):
        pdl_switch(on)
        config = EngineConfig.from_contract(contract, num_pages=5 * 4 + 8, max_num_seqs=8, cuda_graphs=True)
        engine = LLMEngine(model, contract, config, device="cuda")
        engine.generate([[1, 2, 3]], SamplingParams(temperature=1.0, max_tokens=3, ignore_eos=True), progress=False)
        rows[on] = engine.runner.decode_graphs.run(ids, positions, slot_table[:, 40].clone(), slot_table)[0]
        del engine
    assert rows[True].dtype == torch.float32
    assert torch.equal(rows[True].view(torch.int32), rows[False].view(torch.int32))
    assert not torch.equal(rows[True].view(torch.int32), rows[True].roll(1, 0).view(torch.int32))  # the rows differ from each other
