"""`isoexec fingerprint`: what this process would run under a contract, as the handshake exchanges it."""

import json

from .common import add_command, add_contract_flag, add_device_flag, add_model_flag, fitted, grouped
from .errors import input_error


def add_parser(commands):
    show_fp = add_command(
        commands,
        "fingerprint",
        run,
        help="show what this process would run under a contract",
        description="Resolve a contract for one role on this machine and print the fingerprint the handshake "
        "exchanges: the impl, source hash and admission status of every (region, case), library versions, device.",
    )
    add_contract_flag(show_fp, "the contract (default: tiny-dense)")
    show_fp.add_argument("--role", default="engine", choices=("trainer", "engine"), help="which side's cases (default: engine)")
    add_model_flag(show_fp, "the contract as fitted to this model; admission is looked up "
                   "for its shapes (records from `validate --model` with the same model)")
    add_device_flag(show_fp, "the device to describe (default: cpu)")
    show_fp.add_argument("--json", action="store_true", help="print the whole fingerprint as JSON")
    return show_fp


def run(args) -> int:
    from ..runtime import REGISTRY, ResolutionError, fingerprint
    from ..runtime.binding import bind
    from ..validate import geometry_of

    contract, spec = fitted(args)
    cases = contract.cases_of(args.role)
    try:
        # With a model, what a runner of that model would hold (its Binding); without, what the contract resolves to.
        installed = bind(contract, spec, cases).installed if spec is not None else REGISTRY.resolve(contract, cases)
    except ResolutionError as error:
        raise input_error(f"{contract.name}: {grouped(error.problems)}") from None
    except ValueError as error:
        raise input_error(f"{contract.name}: {error}") from None
    fp = fingerprint(contract, installed, role=args.role, device=args.device, geometry=geometry_of(spec))
    if args.json:
        print(json.dumps(fp, indent=2))
        return 0
    device = fp["runtime"]["device"]
    print(f"{args.role} fingerprint under contract {contract.name}")
    print(f"  torch {fp['runtime']['torch']}, triton {fp['runtime']['triton']}, {device['type']} {device['arch']} {device.get('isa') or ''} ({device['name']})")
    for name, value in fp["contract"]["identities"].items():
        print(f"  {name:<17} {value}")
    for region, cells in fp["installed"].items():
        for case, cell in cells.items():
            mark = "admitted" if cell["admitted"] else "not admitted"
            print(f"  {region + '/' + case:<36} {cell['impl']:<34} {mark}")
    return 0
