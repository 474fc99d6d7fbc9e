"""The admission battery: an impl enters the system only after it is shown bitwise equal across every
case it claims, alone and in batches, at many positions, with hazardous values.

Each op family ships a `probe(ctx)` that yields `Trial`s (two tensors that must be bitwise equal, and
what was varied to get them); this module runs the probes for every composition entry of a contract,
in every dtype pass, compares integer views, and reports.
"""

import time
from dataclasses import dataclass, field
from typing import Callable, Iterator

import torch
from torch import Tensor

from ..contract.schema import Contract
from ..contract.vocabulary import BOUNDARY_CONSTANTS
from ..runtime.registry import Impl, Registry

# Row counts a batch is tried at; chosen to straddle the vector widths and tile sizes of common
# backends (the CPU's fp32 GEMM already changes a row's bits from M = 7 on).
BATCH_SIZES = (1, 2, 3, 5, 7, 8, 9, 16, 17, 31, 32, 33, 64)
MAX_FAILURES_LISTED = 12


@dataclass
class Trial:
    """`actual` must be bitwise equal to `expected` (same shape, same bit patterns)."""

    what: str
    expected: Tensor
    actual: Tensor


def _int_view(t: Tensor) -> Tensor:
    t = t.detach().contiguous()
    if not t.is_floating_point():
        return t
    return t.view({8: torch.int64, 4: torch.int32, 2: torch.int16, 1: torch.int8}[t.element_size()])


def mismatch(trial: Trial) -> str | None:
    """None when bitwise equal, else a one-line description of how they differ."""
    e, a = trial.expected, trial.actual
    if e.shape != a.shape:
        return f"{trial.what}: shape {tuple(a.shape)} instead of {tuple(e.shape)}"
    if e.dtype != a.dtype:
        return f"{trial.what}: dtype {a.dtype} instead of {e.dtype}"
    differ = _int_view(e) != _int_view(a)
    if not bool(differ.any()):
        return None
    count = int(differ.sum())
    detail = ""
    if e.is_floating_point():
        delta = (e.double() - a.double()).abs()
        finite = delta[torch.isfinite(delta)]
        detail = f", max |Δ| {float(finite.max()):.3g}" if finite.numel() else ", non-finite"
    return f"{trial.what}: {count} of {e.numel()} elements differ{detail}"


@dataclass
class Context:
    """What a probe needs: the op per case, the grad mode per case, a device, a dtype, randomness, and
    the model's shapes where the contract was fitted to one (`geometry`: num_heads, num_kv_heads,
    head_dim, linear_k (the projections' K values); empty otherwise), for probes whose kernels pick
    instructions or loop structure by those shapes; `impl`, the entry's impl (a probe sizes the engine
    state an impl lays out by it: `Impl.row_width`)."""

    region: str
    ops: dict[str, Callable]
    cases: tuple[str, ...]
    anchor: str
    grad: dict[str, str]
    role: dict[str, str]
    dtype: torch.dtype
    device: torch.device
    constants: dict
    geometry: dict = field(default_factory=dict)
    impl: Impl | None = None
    generator: torch.Generator = field(default_factory=lambda: torch.Generator().manual_seed(0))

    def randn(self, *shape: int, scale: float = 1.0, dtype: torch.dtype | None = None) -> Tensor:
        x = torch.randn(*shape, generator=self.generator, dtype=torch.float32) * scale
        return x.to(dtype or self.dtype).to(self.device)

    def randint(self, high: int, *shape: int) -> Tensor:
        return torch.randint(high, shape, generator=self.generator).to(self.device)

    def call(self, case: str, *args, **kwargs) -> Tensor:
        """Run the op of `case` under that case's grad mode; in autograd cases every floating input
        requires grad, as in training."""
        op = self.ops[case]
        if self.grad[case] != "autograd":
            with torch.no_grad():
                return op(*args, **kwargs)
        with torch.enable_grad():
            args = [a.detach().requires_grad_() if isinstance(a, Tensor) and a.is_floating_point() else a for a in args]
            return op(*args, **kwargs).detach()


def hazard_rows(ctx: Context, width: int) -> Tensor:
    """Rows of values that break careless kernels: signed zeros, subnormals, huge magnitudes, ties."""
    tiny = torch.finfo(ctx.dtype).tiny
    big = 1e30 if ctx.dtype in (torch.float32, torch.bfloat16, torch.float64) else 1e4
    base = torch.randn(width, generator=ctx.generator)
    rows = [
        torch.full((width,), -0.0),
        torch.where(torch.arange(width) % 2 == 0, torch.tensor(0.0), torch.tensor(-0.0)),
        base * tiny / 4,  # subnormal
        base * big,
        torch.full((width,), 1.5),  # ties
        torch.where(torch.arange(width) % 3 == 0, base * big, base * tiny),
    ]
    return torch.stack(rows).to(ctx.dtype).to(ctx.device)


def strided(t: Tensor) -> Tensor:
    """The same values as `t` in a non-contiguous layout (every other element of a wider buffer)."""
    if t.dim() == 0 or t.numel() == 0:
        return t
    wide = torch.full((*t.shape[:-1], 2 * t.shape[-1]), float("nan") if t.is_floating_point() else 0, dtype=t.dtype, device=t.device)
    wide[..., ::2] = t
    view = wide[..., ::2]
    assert not view.is_contiguous() or t.shape[-1] == 1
    return view


def rowwise(ctx: Context, batched: list[Tensor], *shared, sizes=BATCH_SIZES, label: str = "", **kwargs) -> Iterator[Trial]:
    """Trials for an op whose output row i depends only on row i of each `batched` input.

    Every row computed alone in the anchor case is the reference; every case must reproduce it in
    batches of every size, starting at different rows, with strided inputs, and for an empty batch.
    """
    rows = batched[0].shape[0]
    alone = torch.cat([ctx.call(ctx.anchor, *[b[i : i + 1] for b in batched], *shared, **kwargs) for i in range(rows)])
    tag = f"{label}: " if label else ""
    for case in ctx.cases:
        for m in (s for s in sizes if s <= rows):
            for start in sorted({0, rows - m, (rows - m) // 2}):
                out = ctx.call(case, *[b[start : start + m] for b in batched], *shared, **kwargs)
                yield Trial(f"{tag}{case}, rows {start}..{start + m - 1} of a batch of {m} vs alone", alone[start : start + m], out)
        out = ctx.call(case, *[strided(b) for b in batched], *shared, **kwargs)
        yield Trial(f"{tag}{case}, non-contiguous inputs vs alone", alone, out)
        empty = ctx.call(case, *[b[:0] for b in batched], *shared, **kwargs)
        yield Trial(f"{tag}{case}, empty batch", alone[:0], empty)


@dataclass
class EntryResult:
    region: str
    impl: str
    cases: tuple[str, ...]
    constants: dict
    failures: list[str]
    trials: int
    seconds: float
    dtypes: tuple[str, ...]

    @property
    def status(self) -> str:
        return "rejected" if self.failures else "admitted"

    def to_dict(self) -> dict:
        return {
            "region": self.region,
            "impl": self.impl,
            "cases": list(self.cases),
            "status": self.status,
            "failures": self.failures[:MAX_FAILURES_LISTED] + ([f"… and {len(self.failures) - MAX_FAILURES_LISTED} more"] if len(self.failures) > MAX_FAILURES_LISTED else []),
            "trials": self.trials,
            "dtypes": list(self.dtypes),
            "seconds": round(self.seconds, 3),
        }


def _dtype_pass(constants: dict, boundary: str, dtype: str) -> dict:
    """The entry's constants with its boundary dtype replaced by `dtype`; accumulation and compute
    dtypes are the impl's own and stay as pinned."""
    return {k: (dtype if k in BOUNDARY_CONSTANTS and v == boundary else v) for k, v in constants.items()}


def boundary_dtype(constants: dict) -> str:
    for key in BOUNDARY_CONSTANTS:
        if key in constants:
            return constants[key]
    return "float32"


def validate_entry(contract: Contract, entry, probe, *, registry: Registry, device: torch.device, dtypes=("bfloat16", "float32"),
                   geometry: dict | None = None) -> EntryResult:
    """Run `probe` for one composition entry in each dtype pass; the anchor case may use another entry's impl.
    `geometry`: the model's shapes (`Context.geometry`), when the contract is fitted to one."""
    anchor = entry.discharge.case if entry.discharge.method == "bitwise_equal_to" else entry.cases[0]
    involved = sorted(set(entry.cases) | {anchor})
    boundary = boundary_dtype(entry.constants)
    failures, trials, start = [], 0, time.perf_counter()
    done_dtypes = []
    for dtype in dict.fromkeys(d for d in dtypes):
        if dtype != boundary and boundary not in ("bfloat16", "float32"):
            continue
        ops = {}
        for case in involved:
            pinned = contract.entry(entry.region, case)
            impl = registry.get(pinned.impl.id, pinned.impl.version)
            ops[case] = impl.bind(_dtype_pass(pinned.constants, boundary, dtype))
        ctx = Context(
            region=entry.region,
            ops=ops,
            cases=entry.cases,
            anchor=anchor,
            grad={c: contract.cases[c].grad for c in involved},
            role={c: contract.cases[c].role for c in involved},
            dtype=getattr(torch, dtype),
            device=device,
            constants=_dtype_pass(entry.constants, boundary, dtype),
            geometry=dict(geometry or {}),
            impl=registry.get(entry.impl.id, entry.impl.version),
        )
        done_dtypes.append(dtype)
        try:
            for trial in probe(ctx):
                trials += 1
                found = mismatch(trial)
                if found:
                    failures.append(f"{dtype}: {found}")
        except Exception as error:  # an impl that crashes on a battery input is rejected, not fatal
            failures.append(f"{dtype}: raised {type(error).__name__}: {error}")
    return EntryResult(entry.region, str(entry.impl), entry.cases, entry.constants, failures, trials, time.perf_counter() - start, tuple(done_dtypes))
