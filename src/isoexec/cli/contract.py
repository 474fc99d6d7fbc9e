"""`isoexec contract show|hash|diff`: print, hash and compare execution contracts."""

import json

from ..contract import PROJECTIONS, diff_projection, dump_json, identities, load, load_preset, preset_names
from ..contract.diff import render_grouped
from ..contract.render import render
from .common import add_command
from .errors import EXIT_MISMATCH, EXIT_OK, _Parser


def add_parser(commands):
    contract = add_command(
        commands,
        "contract",
        run,
        help="show, hash and compare execution contracts",
        description="Execution contracts pin every detail that decides rounding. Wherever a contract is "
        "read, a TOML or JSON file path or the name of a shipped preset is accepted "
        f"(presets: {', '.join(preset_names())}).",
    )
    actions = contract.add_subparsers(dest="action", required=True, metavar="ACTION", parser_class=_Parser)

    show_ = actions.add_parser("show", help="print a contract", description="Print a contract for people, or as canonical JSON.")
    show_.add_argument("file", nargs="?", metavar="FILE", help="a contract file (default: the preset named by --preset)")
    show_.add_argument("--preset", default="tiny-dense", metavar="NAME", help=f"a shipped preset: {', '.join(preset_names())} (default: tiny-dense)")
    show_.add_argument("--json", action="store_true", help="print the whole contract as canonical JSON")

    hash_ = actions.add_parser(
        "hash",
        help="print a contract's three identities",
        description="Print the semantic, numerical_policy and deployment identities (sha256:<hex>) of a contract.",
    )
    hash_.add_argument("file", metavar="FILE", help="a contract file or preset name")
    hash_.add_argument("--json", action="store_true", help='print {"semantic", "numerical_policy", "deployment"} as JSON')

    diff_ = actions.add_parser(
        "diff",
        help="compare two contracts field by field",
        description="Compare two contracts, naming region, case and field of each difference. "
        "Exit status: 0 when the numerical policies are equal, 1 when they differ, 2 on bad input.",
    )
    diff_.add_argument("a", metavar="A", help="a contract file or preset name")
    diff_.add_argument("b", metavar="B", help="a contract file or preset name")
    diff_.add_argument("--json", action="store_true", help="print the differences as JSON")
    return contract


def run(args) -> int:
    return ACTIONS[args.action](args)


def show(args) -> int:
    contract = load(args.file) if args.file else load_preset(args.preset)
    print(dump_json(contract) if args.json else render(contract))
    return 0


def hash_(args) -> int:
    ids = identities(load(args.file)).to_dict()
    if args.json:
        print(json.dumps(ids, indent=2))
    else:
        for name, value in ids.items():
            print(f"{name:<17} {value}")
    return 0


def diff(args) -> int:
    a, b = load(args.a), load(args.b)
    ids_a, ids_b = identities(a).to_dict(), identities(b).to_dict()
    report, found = {}, {}
    for name, project in PROJECTIONS.items():
        found[name] = diff_projection(name, project(a), project(b))
        differences = [d.to_dict() for d in found[name]]
        report[name] = {"equal": ids_a[name] == ids_b[name], "a": ids_a[name], "b": ids_b[name], "differences": differences}
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(f"A = {args.a}\nB = {args.b}")
        for name, entry in report.items():
            if entry["equal"]:
                print(f"{name}: equal ({entry['a']})")
                continue
            print(f"{name}: differs (A {entry['a']}, B {entry['b']})")
            for line in render_grouped(found[name]):
                print("  " + line.split(": ", 1)[1])
    return EXIT_OK if report["numerical_policy"]["equal"] else EXIT_MISMATCH


ACTIONS = {"show": show, "hash": hash_, "diff": diff}
