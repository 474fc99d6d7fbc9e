"""A process's fingerprint: what it actually runs, next to what its contract says it should run."""

import platform
from importlib import metadata

import torch

from ..contract.identity import identities, numerical_policy_projection, semantic_projection
from ..contract.schema import Contract, to_plain

FINGERPRINT_VERSION = 1


def _package_version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def device_info(device: str | torch.device = "cpu") -> dict:
    """The device a process computes on. `arch` (with `isa` on CPU) is what decides bits."""
    device = torch.device(device)
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        major, minor = torch.cuda.get_device_capability(index)
        return {
            "type": "cuda",
            "name": torch.cuda.get_device_name(index),
            "arch": f"sm_{major}{minor}",
            "cuda": torch.version.cuda,
        }
    if device.type == "cpu":
        return {
            "type": "cpu",
            "name": _cpu_name(),
            "arch": platform.machine(),
            "isa": torch.backends.cpu.get_cpu_capability(),
        }
    return {"type": device.type, "name": str(device), "arch": device.type}


def runtime_info(device: str | torch.device = "cpu") -> dict:
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "triton": _package_version("triton"),
        "device": device_info(device),
    }


def fingerprint(
    contract: Contract,
    installed: dict,
    *,
    role: str,
    parallel: dict | None = None,
    device: str | torch.device = "cpu",
    geometry: dict | None = None,
) -> dict:
    """Fingerprint a process of `role` that runs `installed` ({(region, case): Impl}) under `contract`.

    `installed` is what the process really calls, normally `Registry.resolve(contract, cases)`; the
    handshake compares it with the contract, so anything patched in afterwards is caught there. Each
    cell also says whether an admission record covers it on this device and, with `geometry`
    (`validate.geometry_of` of the model the process runs), at that model's shapes (`isoexec validate --model`).
    The projections travel with the identities so a refusal can name the region, case and field.
    """
    from ..validate import records

    if role not in ("trainer", "engine"):
        raise ValueError(f'role must be "trainer" or "engine", got {role!r}')
    runtime = runtime_info(device)
    cells: dict[str, dict] = {}
    for (region, case), impl in sorted(installed.items()):
        pinned = contract.entry(region, case)
        admitted = pinned is not None and records.is_admitted(impl, pinned.constants, runtime, case, geometry)
        cells.setdefault(region, {})[case] = {"impl": impl.ref, "source_sha256": impl.source_sha256, "admitted": admitted}
    sizes = {"tp": 1, "ep": 1, "sp": False, "dp": 1, **(parallel or {})}
    return {
        "fingerprint_version": FINGERPRINT_VERSION,
        "role": role,
        "cases": list(contract.cases_of(role)),
        "contract": {
            "name": contract.name,
            "identities": identities(contract).to_dict(),
            "semantic": semantic_projection(contract),
            "numerical_policy": numerical_policy_projection(contract),
        },
        "installed": cells,
        "runtime": runtime,
        "parallel": sizes,
        "guarantees": {"bitwise": contract.claims.is_bitwise, **to_plain(contract.claims)},
    }
