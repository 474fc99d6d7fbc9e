"""The `isoexec` command line."""

import argparse
import json
import sys
from pathlib import Path

from .contract import PROJECTIONS, ContractError, diff_projection, dump_json, identities, load, load_preset, preset_names
from .contract.diff import render_grouped
from .contract.render import render
from .rl.outputs import write_text

# Exit statuses, the same for every command.
EXIT_OK = 0
EXIT_MISMATCH = 1  # the gate stopped a run (train, demo), a mismatch under a bitwise contract (audit),
#                    a rejected kernel (validate), different numerical policies (contract diff)
EXIT_INPUT_ERROR = 2  # bad input, said in one line on stderr
EXIT_INTERRUPTED = 130  # Ctrl-C: 128 + SIGINT, as a shell reports a process the signal ended


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        self.exit(EXIT_INPUT_ERROR, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def input_error(problem) -> ContractError:
    """The exception `main` turns into `isoexec: error: <problem>` and exit status 2."""
    return ContractError("", str(problem))


def require_device(device: str) -> None:
    import torch

    if device == "cuda" and not torch.cuda.is_available():
        raise input_error("--device cuda: no CUDA device is available here")


def check_output_path(flag: str, path) -> None:
    """Refuse, before any work, an output FILE that could not be written when the work is done."""
    if path is None:
        return
    path = Path(path)
    if path.is_dir():
        raise input_error(f"{flag} {path} is a directory")
    if not path.parent.is_dir():
        raise input_error(f"{flag} {path}: folder {path.parent} does not exist")


def check_runnable(contract, device: str) -> None:
    """Refuse, before any work, a contract pinning an impl this process does not have, or Triton kernels
    on a CPU where they would not run (they need a GPU there, or the interpreter, TRITON_INTERPRET=1)."""
    from . import ops  # noqa: F401  (registers the op families)
    from .ops import triton_support
    from .runtime import REGISTRY, ResolutionError

    try:
        installed = REGISTRY.resolve(contract)
    except ResolutionError as error:
        raise input_error(f"contract {contract.name}: {_grouped(error.problems)}") from None
    kernels = sorted({impl.ref for impl in installed.values() if impl.gpu_kernels})
    if device == "cpu" and kernels and not triton_support.interpreting():
        raise input_error(f"contract {contract.name} runs Triton kernels ({', '.join(kernels)}), which need --device cuda "
                          "or, on a CPU, TRITON_INTERPRET=1 in the environment (slow)")


def _grouped(problems: list[str]) -> str:
    """'region/case: problem' lines as one line, the cases sharing a problem named once:
    'attention/{engine_decode,trainer_fwd}: impl … is not registered'."""
    cases: dict[tuple[str, str], list[str]] = {}
    for line in problems:
        where, _, problem = line.partition(": ")
        region, _, case = where.rpartition("/")
        cases.setdefault((region, problem), []).append(case)
    return "; ".join(f"{region}/{names[0] if len(names) == 1 else '{' + ','.join(names) + '}'}: {problem}"
                     for (region, problem), names in cases.items())


def check_rl_inputs(config, warn) -> None:
    """What `train` and `demo` refuse before the warm-up: data the run cannot use (with skip_bad_examples,
    `warn` is told what is dropped instead), and a contract this machine cannot run (RL runs on the CPU)."""
    from .rl.loop import setup, usable_task

    try:
        _, dropped = usable_task(config)
        _, _, contract = setup(config)
    except ValueError as error:
        raise input_error(error) from None
    if dropped:
        warn(dropped)
    check_runnable(contract, "cpu")


def _contract_show(args) -> int:
    contract = load(args.file) if args.file else load_preset(args.preset)
    print(dump_json(contract) if args.json else render(contract))
    return 0


def _contract_hash(args) -> int:
    ids = identities(load(args.file)).to_dict()
    if args.json:
        print(json.dumps(ids, indent=2))
    else:
        for name, value in ids.items():
            print(f"{name:<17} {value}")
    return 0


def _contract_diff(args) -> int:
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


def _fitted(args):
    """(contract, spec): --contract loaded, and fitted to --model where one is given (spec None otherwise)."""
    contract, spec = load(args.contract), None
    if args.model is not None:
        from .model import PRESETS, SpecError, fit_contract, read_config

        if args.model not in PRESETS and not Path(args.model).is_dir():
            raise ContractError("", f"--model {args.model!r} is neither a model preset ({', '.join(PRESETS)}) nor a checkpoint directory")
        try:
            spec = PRESETS[args.model] if args.model in PRESETS else read_config(args.model)
        except (SpecError, OSError) as error:
            raise ContractError("", f"--model: {error}") from None
        contract = fit_contract(contract, spec, profile=args.model)
    return contract, spec


def _validate(args) -> int:
    import torch

    from .validate import records, validate

    contract, spec = _fitted(args)
    require_device(args.device)
    check_output_path("--json", args.json)
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

    report = validate(contract, device=args.device, progress=progress, record=not args.no_record, spec=spec)
    print(f"{report['admitted']} admitted, {report['rejected']} rejected in {report['seconds']} s" + ("" if args.no_record else f"; records in {records.records_dir()}"))
    if args.json:
        write_text(args.json, json.dumps(report, indent=2))
    return EXIT_MISMATCH if report["rejected"] else EXIT_OK


def _fingerprint(args) -> int:
    from . import ops  # noqa: F401  (registers the op families)
    from .runtime import REGISTRY, ResolutionError, fingerprint
    from .validate import geometry_of

    contract, spec = _fitted(args)
    require_device(args.device)
    try:
        installed = REGISTRY.resolve(contract, contract.cases_of(args.role))
    except ResolutionError as error:
        raise input_error(f"{contract.name}: {_grouped(error.problems)}") from None
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


def _audit(args) -> int:
    from .audit import FAMILY_CONTRACTS, Tracer, all_equal, render, run_audit
    from .audit.run import AuditError
    from .model import SpecError, fit_contract, load_model

    if (args.requests is not None and args.requests < 1) or args.max_new_tokens < 1:
        raise input_error("--requests and --max-new-tokens must be at least 1")
    if args.no_chat_template and args.prompts is None:
        raise input_error("--no-chat-template applies to --prompts only (random prompts are token ids already)")
    require_device(args.device)
    check_output_path("--json", args.json)
    family = load(args.contract) if args.contract else load(FAMILY_CONTRACTS["dense"])
    try:
        prompts = _file_prompts(args) if args.prompts is not None else None  # before the weights: its errors come cheap
        model = load_model(args.model, seed=args.seed).to(args.device)
    except SpecError as error:
        raise input_error(error) from None
    contract = fit_contract(family, model.spec, profile=str(args.model))
    check_runnable(contract, args.device)
    tracer = Tracer() if args.trace else None
    requests = args.requests if args.requests is not None else len(prompts) if prompts is not None else 16
    try:
        report = run_audit(model, contract, requests=requests, max_new_tokens=args.max_new_tokens, seed=args.seed,
                           device=args.device, progress=not args.quiet, tracer=tracer, prompts=prompts)
    except AuditError as error:
        raise input_error(error) from None
    print(render(report))
    if args.json:
        write_text(args.json, json.dumps(report, indent=2))
    return EXIT_OK if all_equal(report) or not contract.claims.is_bitwise else EXIT_MISMATCH


def _file_prompts(args) -> list[list[int]]:
    """--prompts encoded with the tokenizer of the --model checkpoint, through its chat template unless
    --no-chat-template; each prompt checked against the model's length with --max-new-tokens."""
    from .audit.workload import file_prompts
    from .model import PRESETS, read_config
    from .rl.tasks.tokenizer import checkpoint_tokenizer

    if str(args.model) in PRESETS and not Path(args.model).exists():
        raise input_error(f"--prompts needs a checkpoint directory for --model, whose tokenizer encodes them; "
                          f"{args.model} is a preset with random weights and no tokenizer")
    if not Path(args.prompts).is_file():
        raise input_error(f"--prompts {args.prompts} {'is a directory' if Path(args.prompts).is_dir() else 'does not exist'}")
    spec = read_config(args.model)  # a SpecError for a folder that is no checkpoint: one line in _audit
    try:
        tokenizer = checkpoint_tokenizer(args.model, spec, chat_template=not args.no_chat_template)
    except ValueError as error:
        raise input_error(f"--model {error}") from None
    try:
        return file_prompts(args.prompts, tokenizer, max_length=spec.max_position_embeddings, max_new_tokens=args.max_new_tokens)
    except ValueError as error:
        raise input_error(f"--prompts {error}") from None


def _demo(args) -> int:
    from .model import SpecError
    from .rl import outputs
    from .rl.config import config_from_args
    from .rl.demo import demo
    from .rl.gate import GateError
    from .rl.handshake import AdmissionError

    try:
        config = config_from_args(args)
    except ValueError as error:
        raise input_error(error) from None
    if Path(args.out).exists() and not Path(args.out).is_dir():
        raise input_error(f"--out {args.out} is not a directory")
    check_output_path("--json", args.json)
    check_rl_inputs(config, warn=outputs.warn)
    try:
        summary = demo(config, out_dir=args.out, progress=not args.quiet)
        if args.json:
            outputs.write_text(args.json, json.dumps(summary, indent=2))
    except GateError as error:
        print(f"isoexec: {error}", file=sys.stderr)
        return EXIT_MISMATCH
    except (AdmissionError, SpecError) as error:  # SpecError: --model's weights unreadable
        raise input_error(error) from None
    except OSError as error:
        raise input_error(f"{error.filename}: {error.strerror}" if error.filename else error) from None
    return EXIT_OK if summary["contract"]["steps_with_mismatch"] == 0 else EXIT_MISMATCH


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="isoexec",
        description="Bitwise identical token log-probabilities between an RL trainer and its rollout engine.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=_Parser)

    contract = commands.add_parser(
        "contract",
        help="show, hash and compare execution contracts",
        description="Execution contracts pin every detail that decides rounding. Wherever a contract is "
        "read, a TOML or JSON file path or the name of a shipped preset is accepted "
        f"(presets: {', '.join(preset_names())}).",
    )
    actions = contract.add_subparsers(dest="action", required=True, metavar="ACTION", parser_class=_Parser)

    show = actions.add_parser("show", help="print a contract", description="Print a contract for people, or as canonical JSON.")
    show.add_argument("file", nargs="?", metavar="FILE", help="a contract file (default: the preset named by --preset)")
    show.add_argument("--preset", default="tiny-dense", metavar="NAME", help=f"a shipped preset: {', '.join(preset_names())} (default: tiny-dense)")
    show.add_argument("--json", action="store_true", help="print the whole contract as canonical JSON")
    show.set_defaults(run=_contract_show)

    hash_ = actions.add_parser(
        "hash",
        help="print a contract's three identities",
        description="Print the semantic, numerical_policy and deployment identities (sha256:<hex>) of a contract.",
    )
    hash_.add_argument("file", metavar="FILE", help="a contract file or preset name")
    hash_.add_argument("--json", action="store_true", help='print {"semantic", "numerical_policy", "deployment"} as JSON')
    hash_.set_defaults(run=_contract_hash)

    diff = actions.add_parser(
        "diff",
        help="compare two contracts field by field",
        description="Compare two contracts, naming region, case and field of each difference. "
        "Exit status: 0 when the numerical policies are equal, 1 when they differ, 2 on bad input.",
    )
    diff.add_argument("a", metavar="A", help="a contract file or preset name")
    diff.add_argument("b", metavar="B", help="a contract file or preset name")
    diff.add_argument("--json", action="store_true", help="print the differences as JSON")
    diff.set_defaults(run=_contract_diff)

    check = commands.add_parser(
        "validate",
        help="run the kernel admission battery over a contract",
        description="For every composition entry, check bitwise equality of the pinned impl across its cases: a row "
        "alone vs inside batches of many sizes and at many positions, every pair of cases (training, prefill chunks, "
        "decode), contiguous vs strided inputs, fp32 and bf16, and hazardous values. Admitted impls get an admission "
        "record that the runtime fingerprint consults (for --model, at that model's shapes only). Exit status: 0 when every impl is admitted, 1 when any is "
        "rejected, 2 on bad input.",
    )
    check.add_argument("--contract", default="tiny-dense", metavar="PRESET|FILE", help="the contract to validate (default: tiny-dense)")
    check.add_argument("--model", metavar="PRESET|DIR", help="validate the contract as fitted to this model (its dtype and the "
                       "kernel tiles chosen for its shapes); a model preset or a checkpoint directory with config.json")
    check.add_argument("--device", default="cpu", choices=("cpu", "cuda"), help="where to run the battery (default: cpu)")
    check.add_argument("--json", metavar="FILE", help="also write the report as JSON to FILE")
    check.add_argument("--no-record", action="store_true", help="do not write admission records")
    check.set_defaults(run=_validate)

    show_fp = commands.add_parser(
        "fingerprint",
        help="show what this process would run under a contract",
        description="Resolve a contract for one role on this machine and print the fingerprint the handshake "
        "exchanges: the impl, source hash and admission status of every (region, case), library versions, device.",
    )
    show_fp.add_argument("--contract", default="tiny-dense", metavar="PRESET|FILE", help="the contract (default: tiny-dense)")
    show_fp.add_argument("--role", default="engine", choices=("trainer", "engine"), help="which side's cases (default: engine)")
    show_fp.add_argument("--model", metavar="PRESET|DIR", help="the contract as fitted to this model; admission is looked up "
                         "for its shapes (records from `validate --model` with the same model)")
    show_fp.add_argument("--device", default="cpu", choices=("cpu", "cuda"), help="the device to describe (default: cpu)")
    show_fp.add_argument("--json", action="store_true", help="print the whole fingerprint as JSON")
    show_fp.set_defaults(run=_fingerprint)

    audit = commands.add_parser(
        "audit",
        help="roll out a workload, score it in the trainer, compare log-probs bit for bit",
        description="Run a mixed workload through the engine (varied prompt lengths, shared prefixes, chunked prefill, "
        "preemption, mixed sampling; random token prompts, or a file's with --prompts), score the same sequences in the "
        "trainer under a different packing (trainer_score and trainer_fwd), and compare every sampled token's log-probability and every full-vocabulary row bit for bit. "
        "Exit status: 0 when everything is bitwise equal (or the contract claims nothing), 1 on a mismatch under a "
        "bitwise contract, 2 on bad input.",
    )
    audit.add_argument("--model", default="tiny-dense", metavar="PRESET|DIR", help="a model preset with seeded random weights (tiny-dense, qwen3-0.6b-random) or a Hugging Face checkpoint directory (default: tiny-dense)")
    audit.add_argument("--contract", metavar="PRESET|FILE", help="the contract (default: the model family's IsoExec contract; 'native' for the fast path)")
    audit.add_argument("--requests", type=int, metavar="N", help="number of requests (default: 16; with --prompts, one per "
                       "prompt, and more cycle through them again)")
    audit.add_argument("--prompts", metavar="FILE", help='JSONL file of {"prompt": ...} objects ("answer" is allowed and '
                       "ignored): the requests' prompts in place of random tokens, encoded with the --model checkpoint's own "
                       "tokenizer, through its chat template where it has one")
    audit.add_argument("--no-chat-template", action="store_true", help="with --prompts: encode each prompt as raw text, "
                       "not as a user message through the checkpoint's chat template")
    audit.add_argument("--max-new-tokens", type=int, default=16, metavar="T", help="tokens generated per request (default: 16)")
    audit.add_argument("--seed", type=int, default=0, metavar="S", help="seed of prompts, sampling and preset weights (default: 0)")
    audit.add_argument("--device", default="cpu", choices=("cpu", "cuda"), help="where to run (default: cpu)")
    audit.add_argument("--json", metavar="FILE", help="also write the report as JSON to FILE")
    audit.add_argument("--trace", action="store_true", help="trace the first mismatching token op by op and name the first diverging region")
    audit.add_argument("--quiet", action="store_true", help="no progress bar")
    audit.set_defaults(run=_audit)

    from .rl.config import add_config_flags

    demo = commands.add_parser(
        "demo",
        help="train a tiny model (or your checkpoint) with RL under the contract and under native, side by side",
        description="Warm up a tiny model on an embedded verifiable task (or start from your Hugging Face checkpoint "
        "with --model: its own tokenizer and chat template, in float32), then run the same GRPO/DAPO training under "
        "the IsoExec contract and under the native fast path. Every step's trainer log-probs are compared with the "
        "rollout's: under the contract any difference stops the run (the gate); under native it is measured. Prints "
        "a per-step table and a summary, writes log.jsonl, plot.png and summary.json (together, once both paths are "
        "done). Exit status: 0 when the contract path saw zero mismatch on every step, 1 otherwise, 2 on bad input, "
        "130 when interrupted.",
    )
    add_config_flags(demo)
    demo.add_argument("--out", default="isoexec-demo", metavar="DIR", help="where to write log.jsonl, plot.png, summary.json (default: isoexec-demo)")
    demo.add_argument("--json", metavar="FILE", help="also write the summary as JSON to FILE")
    demo.add_argument("--quiet", action="store_true", help="no progress bar")
    demo.set_defaults(run=_demo)

    from .parity import add_parser as add_parity
    from .rl.train import add_parser as add_train

    add_train(commands)
    add_parity(commands)
    return parser


def _is_spec_error(error: Exception) -> bool:
    """A model config the code cannot run (`model.SpecError`), looked up only once one is raised: the
    model package imports torch, which `isoexec --help` should not wait for."""
    from .model.spec import SpecError

    return isinstance(error, SpecError)


def main(argv=None) -> int:
    try:
        args = build_parser().parse_args(argv)
        return args.run(args)
    except ContractError as error:
        print(f"isoexec: error: {error}", file=sys.stderr)
        return EXIT_INPUT_ERROR
    except ValueError as error:
        if not _is_spec_error(error):
            raise
        print(f"isoexec: error: {error}", file=sys.stderr)
        return EXIT_INPUT_ERROR
    except KeyboardInterrupt:
        print("isoexec: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        sys.stderr.close()
        return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
