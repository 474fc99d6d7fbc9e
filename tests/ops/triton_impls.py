"""What the tests of every Triton impl share, whatever its family: a registry of some impls, tiny-dense
with one region pinned to an impl, the battery's admission of it, the reduced probes' batch sizes, the
float64 gradient check, and the check that without triton their modules import and register nothing.
tests/ops/elementwise_triton.py and tests/ops/kernels_triton.py build on it.

It imports no Triton module itself: the callers pass theirs.
"""

import dataclasses
import subprocess
import sys

from conftest import DEVICE
from isoexec.contract import load_preset
from isoexec.contract.schema import ImplRef
from isoexec.runtime.registry import Registry
from isoexec.validate.battery import validate_entry

SMALL_SIZES = (1, 3, 16)  # the batch sizes of the reduced probes the interpreter runs


def registry_of(*modules) -> Registry:
    """A registry with what each of `modules` (an ops/<family>/*triton.py) registers."""
    registry = Registry()
    for module in modules:
        module.register(registry)
    return registry


def contract_with(region: str, impl_id: str, constants: dict | None = None):
    """tiny-dense with `region` pinned to `impl_id`@1 and, unless None, `constants` in every case."""
    contract = load_preset("tiny-dense")
    change = {} if constants is None else {"constants": constants}
    composition = tuple(
        dataclasses.replace(e, impl=ImplRef(id=impl_id, version=1), **change) if e.region == region else e
        for e in contract.composition
    )
    return dataclasses.replace(contract, composition=composition)


def validate_pinned(region: str, impl_id: str, constants: dict, probe, registry: Registry, case: str = "trainer_fwd"):
    """The battery's result for `region`'s `case` entry of `contract_with(region, impl_id, constants)`."""
    contract = contract_with(region, impl_id, constants)
    return validate_entry(contract, contract.entry(region, case), probe, registry=registry, device=DEVICE)


def assert_admitted(result, min_trials: int) -> None:
    """The battery admitted the impl in bfloat16 and float32, after at least `min_trials` trials."""
    assert result.status == "admitted", result.failures[:5]
    assert result.dtypes == ("bfloat16", "float32") and result.trials >= min_trials


def assert_gradients_match_float64(op, float64_op, inputs, g, tol: float) -> None:
    """The gradients of `op(*inputs)` under the incoming `g` are each within `tol` (absolute) of float64
    autograd's through `float64_op`."""
    params = [t.clone().requires_grad_() for t in inputs]
    op(*params).backward(g)
    exact = [t.double().requires_grad_() for t in inputs]
    float64_op(*exact).backward(g.double())
    for got, want in zip(params, exact):
        assert (got.grad.double() - want.grad).abs().max() < tol


def assert_import_and_register_nothing_without_triton(*modules: str) -> None:
    """In a fresh interpreter where `import triton` fails, `modules` (dotted names) import, and register
    nothing."""
    script = (
        "import importlib, sys; sys.modules['triton'] = None\n"
        "from isoexec.runtime.registry import Registry\n"
        f"modules = [importlib.import_module(name) for name in {modules!r}]\n"
        "registry = Registry()\nfor m in modules: m.register(registry)\n"
        "assert len(registry) == 0\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
