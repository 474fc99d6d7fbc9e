import copy
import os
import subprocess
import tomllib
from importlib import resources

import pytest
import torch

# Under pytest-xdist the workers share this machine's cores: each takes its share of threads, as does every
# process it starts (they inherit OMP_NUM_THREADS). OpenMP threads that outnumber the cores spin against
# each other: two `isoexec demo` runs side by side at 2 threads each took 290 s, at 1 thread each 45 s.
NUM_XDIST_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if NUM_XDIST_WORKERS > 1:
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, len(os.sched_getaffinity(0)) // NUM_XDIST_WORKERS)))
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))

# Triton's interpreter mode is fixed by its first import (isoexec.ops imports the kernels): without a
# GPU, run the Triton kernels in the interpreter so the CPU suite covers their logic.
ON_GPU = torch.cuda.is_available()
# The dtype passes a battery of Triton kernels runs: both on a GPU; float32 alone in the interpreter, whose
# bfloat16 conversion truncates (its bits are not the GPU's anyway) and whose runs are slow.
BATTERY_DTYPES = ("bfloat16", "float32") if ON_GPU else ("float32",)
if not ON_GPU:
    os.environ.setdefault("TRITON_INTERPRET", "1")

from isoexec.contract import Contract

# Where the Triton kernel tests put their tensors: the GPU when there is one, else the interpreter's CPU.
DEVICE = torch.device("cuda" if ON_GPU else "cpu")

# The hazard rows overflow in numpy on purpose (the interpreter's arithmetic).
INTERPRETER_WARNINGS = pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning",
                                                  "ignore:invalid value encountered:RuntimeWarning")


def triton_runs_here() -> bool:
    """Whether Triton kernels can run in this session: compiled for a GPU, or in the interpreter (which
    needs TRITON_INTERPRET set, as above, before anything imported triton)."""
    try:
        from isoexec.ops import triton_support
    except ImportError:
        return False
    return triton_support.triton_available() and (ON_GPU or triton_support.interpreting())


def require_triton() -> None:
    """Skip the calling test module unless `triton_runs_here()`."""
    pytest.importorskip("triton")
    if not triton_runs_here():
        pytest.skip("no GPU, and triton was imported before TRITON_INTERPRET=1 was set", allow_module_level=True)


class CountingKernel:
    """Stands in for a module's Triton kernel and counts the launches through it."""

    def __init__(self, kernel):
        self.kernel, self.launches = kernel, 0

    def __getitem__(self, grid):
        self.launches += 1
        return self.kernel[grid]


def randn(*shape: int, seed: int, scale: float = 1.0, dtype=torch.float32) -> torch.Tensor:
    """Seeded normal values on DEVICE (drawn in float32 on the CPU, so the same on every machine)."""
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g) * scale).to(dtype).to(DEVICE)


def hazards(width: int, dtype=torch.float32) -> torch.Tensor:
    """The battery's hazardous rows (signed zeros, subnormals, huge magnitudes, ties) on DEVICE: [6, width]."""
    from types import SimpleNamespace

    from isoexec.validate.battery import hazard_rows

    return hazard_rows(SimpleNamespace(dtype=dtype, device=DEVICE, generator=torch.Generator().manual_seed(99)), width)


def boundary(constants: dict, dtype: torch.dtype) -> dict:
    """`constants` with their float32 boundary dtypes (input, weight, output) replaced by `dtype`."""
    name = str(dtype).removeprefix("torch.")
    return {k: name if k in ("input_dtype", "weight_dtype", "output_dtype") and v == "float32" else v for k, v in constants.items()}


def preset_dict(name: str) -> dict:
    """A fresh, mutable parse of a shipped preset file."""
    text = (resources.files("isoexec.contract") / "presets" / f"{name}.toml").read_text("utf-8")
    return tomllib.loads(text)


@pytest.fixture
def dense() -> dict:
    return preset_dict("tiny-dense")


@pytest.fixture
def native() -> dict:
    return preset_dict("native")


def mutated(data: dict, edit) -> Contract:
    """Apply `edit` to a deep copy of `data` and build the contract."""
    data = copy.deepcopy(data)
    edit(data)
    return Contract.from_dict(data)


def entry_index(data: dict, region: str) -> int:
    return next(i for i, e in enumerate(data["composition"]) if e["region"] == region)


@pytest.fixture(autouse=True)
def _isoexec_home(request, tmp_path_factory, monkeypatch):
    """Admission records written by a test go to a temporary folder, never the user's cache: one per xdist worker,
    which its tests share as a user's runs share theirs (each contract's battery runs once per worker, not in every
    test that starts a run), or the test's own where it is marked `fresh_isoexec_home` (tests of the records, the
    fingerprint's lookups, the battery's first run). A record is keyed by the impl's source files, constants,
    libraries and the model's geometry: a test that patches code an impl calls outside those files, and then needs
    the battery to run on it, takes the mark too."""
    own = request.node.get_closest_marker("fresh_isoexec_home") is not None
    home = tmp_path_factory.mktemp("isoexec_home") if own else tmp_path_factory.getbasetemp() / "isoexec_home"
    monkeypatch.setenv("ISOEXEC_HOME", str(home))


def int_view(t):
    """Bit patterns of a float tensor as integers, so -0.0 vs +0.0 and NaN payloads count."""
    import torch

    return t.contiguous().view({8: torch.int64, 4: torch.int32, 2: torch.int16}[t.element_size()])


def bitwise_equal(a, b) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and bool((int_view(a) == int_view(b)).all())


def batch_dependent(op, batched, *shared, sizes=(2, 3, 7, 16, 33)):
    """(m, start) of every batch in which some row differs in bits from the same row computed alone."""
    import torch

    rows = batched[0].shape[0]
    alone = torch.cat([op(*[b[i : i + 1] for b in batched], *shared) for i in range(rows)])
    found = []
    for m in (s for s in sizes if s <= rows):
        for start in sorted({0, rows - m}):
            if not bitwise_equal(op(*[b[start : start + m] for b in batched], *shared), alone[start : start + m]):
                found.append((m, start))
    return found


def run_battery(preset: str, region: str, case: str = "trainer_fwd"):
    """The admission battery's result for the entry pinning `region` in `case` of a shipped preset."""
    import torch

    from isoexec.contract import load_preset
    from isoexec.runtime import REGISTRY
    from isoexec.validate.battery import validate_entry

    contract = load_preset(preset)
    return validate_entry(contract, contract.entry(region, case), REGISTRY.probe(region), registry=REGISTRY, device=torch.device("cpu"))


def fused_norms(data: dict, impl_id: str, constants: dict | None = None) -> Contract:
    """A preset's dict with the norms after a residual add moved out of its rms_norm entry into an
    rms_norm.residual entry pinning `impl_id`@1 with `constants` (default: the rms_norm entry's), and
    without its residual entry."""
    from isoexec.model.spec import RESIDUAL_NORM_OPS

    def edit(d):
        plain = d["composition"][entry_index(d, "rms_norm")]
        fused = {**copy.deepcopy(plain), "region": "rms_norm.residual", "ops": list(RESIDUAL_NORM_OPS),
                 "impl": {"id": impl_id, "version": 1}}
        if constants is not None:
            fused["constants"] = constants
        plain["ops"] = [op for op in plain["ops"] if op not in RESIDUAL_NORM_OPS]
        d["composition"] = [e for e in d["composition"] if e["region"] != "residual"] + [fused]

    return mutated(data, edit)


def unfused_norms(data: dict, residual_impl_id: str, residual_constants: dict) -> Contract:
    """The reverse of `fused_norms`: the rms_norm.residual entry's norms back in the rms_norm entry,
    composed with a residual entry pinning `residual_impl_id`@1."""

    def edit(d):
        fused = d["composition"].pop(entry_index(d, "rms_norm.residual"))
        d["composition"][entry_index(d, "rms_norm")]["ops"] += fused["ops"]
        d["composition"].append({**copy.deepcopy(fused), "region": "residual", "ops": ["residual_add"],
                                 "impl": {"id": residual_impl_id, "version": 1}, "constants": residual_constants})

    return mutated(data, edit)


def default_sigint():
    """preexec_fn for a subprocess a test will Ctrl-C: a process started with SIGINT ignored (a
    background job of a non-interactive shell) would keep ignoring it; a user's Ctrl-C reaches a
    foreground process with the default disposition."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)


def isoexec_here(capsys, *args: str) -> subprocess.CompletedProcess:
    """`isoexec args` through the console entry's `main`, in this process: for refusals, which `main` catches
    and prints, where a process would spend its seconds on imports. (Tests of the process itself, its exit
    on a signal, its environment, run `python -m isoexec`.)"""
    from isoexec.cli import main

    try:
        returncode = main(list(args))
    except SystemExit as exit:  # argparse's own refusals
        returncode = exit.code
    captured = capsys.readouterr()
    return subprocess.CompletedProcess(list(args), returncode, captured.out, captured.err)
