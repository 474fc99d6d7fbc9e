"""`isoexec validate`: the kernel admission battery over a contract."""

import json

from ..rl.outputs import write_text
from .common import (add_command, add_contract_flag, add_device_flag, add_json_file_flag, add_model_flag, check_output_path,
                     fitted)
from .errors import EXIT_MISMATCH, EXIT_OK, input_error


def add_parser(commands):
    check = add_command(
        commands,
        "validate",
        run,
        help="run the kernel admission battery over a contract",
        description="For every composition entry, check bitwise equality of the pinned impl across its cases: a row "
        "alone vs inside batches of many sizes and at many positions, every pair of cases (training, prefill chunks, "
        "decode), contiguous vs strided inputs, fp32 and bf16, and hazardous values. Admitted impls get an admission "
        "record that the runtime fingerprint consults (for --model, at that model's shapes only). Exit status: 0 when every impl is admitted, 1 when any is "
        "rejected, 2 on bad input.",
    )
    add_contract_flag(check, "the contract to validate (default: tiny-dense)")
    add_model_flag(check, "validate the contract as fitted to this model (its dtype and the "
                   "kernel tiles chosen for its shapes); a model preset or a checkpoint directory with config.json")
    add_device_flag(check, "where to run the battery (default: cpu)")
    add_json_file_flag(check, "report")
    check.add_argument("--region", action="append", metavar="NAME",
                       help="validate only this region's entries (repeatable; e.g. after changing one kernel)")
    check.add_argument("--no-record", action="store_true", help="do not write admission records")
    return check


def run(args) -> int:
    import torch

    from ..runtime import REGISTRY
    from ..validate import records, validate

    contract, spec = fitted(args)
    check_output_path("--json", args.json)
    regions = None
    if args.region:
        known = dict.fromkeys(entry.region for entry in contract.composition)
        unknown = [name for name in args.region if name not in known]
        if unknown:
            raise input_error(f"--region {unknown[0]}: contract {contract.name} has no such region (it has: {', '.join(known)})")
        regions = set(args.region)
    REGISTRY.load()  # the op families (Triton's libraries with them) load before the first line, not under the battery
    print(f"validating {contract.name} on {args.device} (torch {torch.__version__})", flush=True)

    def progress(result):
        flag = "admitted" if result.status == "admitted" else "REJECTED"
        cases = "all cases" if set(result.cases) == set(contract.cases) else ",".join(result.cases)
        failed = f", {len(result.failures)} failed" if result.failures else ""
        print(f"  {flag:<8}  {result.region:<20} {result.impl:<34} {cases:<28} {result.trials} trials{failed}  {result.seconds:.1f} s", flush=True)
        for failure in result.failures[:3]:
            print(f"      {failure}", flush=True)
        if len(result.failures) > 3:
            print(f"      … {len(result.failures) - 3} more (see --json)", flush=True)

    report = validate(contract, device=args.device, progress=progress, record=not args.no_record, spec=spec, regions=regions)
    print(f"{report['admitted']} admitted, {report['rejected']} rejected in {report['seconds']} s" + ("" if args.no_record else f"; records in {records.records_dir()}"))
    if args.json:
        write_text(args.json, json.dumps(report, indent=2))
    return EXIT_MISMATCH if report["rejected"] else EXIT_OK
