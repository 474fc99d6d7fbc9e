"""The contract handshake between the trainer and the engine, before the first step."""

import sys

from ..runtime import REGISTRY, fingerprint, runtime_info
from ..validate import geometry_of, records, validate


class AdmissionError(RuntimeError):
    """The admission battery rejected kernels the contract pins: it cannot run bitwise on this machine."""


def ensure_admitted(contract, device: str = "cpu", spec=None, binding=None) -> None:
    """Run the admission battery for `contract` on this machine, at the shapes of the model `spec` it
    was fitted to, unless records already cover it: every cell of the contract, or with `binding` (a
    runner's `Binding`) the cells that runner holds."""
    if not contract.claims.is_bitwise:
        return
    runtime, geometry = runtime_info(device), geometry_of(spec)
    installed = binding.installed if binding is not None else REGISTRY.resolve(contract)
    covered = all(records.is_admitted(impl, contract.entry(region, case).constants, runtime, case, geometry)
                  for (region, case), impl in installed.items() if contract.entry(region, case).discharge.method == "bitwise_equal_to")
    if not covered:
        # Tens of seconds on a CPU, once per machine, contract and model: say what the wait is.
        print(f"admission: no records cover contract {contract.name} at this model's shapes on this machine; running the "
              "battery (isoexec validate), once…", file=sys.stderr, flush=True)
        report = validate(contract, device=device, spec=spec)
        if report["rejected"]:
            rejected = ", ".join(k["impl"] for k in report["kernels"] if k["status"] == "rejected")
            raise AdmissionError(f"the admission battery rejected {rejected} under contract {contract.name} on this machine "
                                 "(isoexec validate shows why)")


def side_fingerprint(binding, role: str, device: str = "cpu", spec=None, mesh=None) -> dict:
    """What this process's runner holds for `role`'s cases (`Binding`, for the model `spec`), ready to
    exchange with the other side; with its `mesh`, the side's parallel sizes, which the handshake holds
    against the contract's claimed topology."""
    return fingerprint(binding.contract, binding.installed, role=role, device=device, geometry=geometry_of(spec),
                       parallel=None if mesh is None else mesh.sizes())
