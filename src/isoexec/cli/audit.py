"""`isoexec audit`: roll out a workload in the engine, score it in the trainer, compare log-probs bit for bit."""

import json
import os
import sys
from pathlib import Path

from ..contract import load
from ..rl.outputs import write_text
from .common import (add_command, add_contract_flag, add_device_flag, add_json_file_flag, add_model_flag, add_quiet_flag, check_vllm,
                     check_output_path, check_runnable, require_device)
from .errors import EXIT_MISMATCH, EXIT_OK, input_error


def add_parser(commands):
    audit = add_command(
        commands,
        "audit",
        run,
        help="roll out a workload, score it in the trainer, compare log-probs bit for bit",
        description="Run a mixed workload through the engine (varied prompt lengths, shared prefixes, chunked prefill, "
        "preemption, mixed sampling; random token prompts, or a file's with --prompts), score the same sequences in the "
        "trainer under a different packing (trainer_score and trainer_fwd), and compare every sampled token's log-probability and every full-vocabulary row bit for bit "
        "(and, for an MoE model, the experts each token's row was routed to). "
        "Exit status: 0 when everything is bitwise equal (or the contract claims nothing), 1 on a mismatch under a "
        "bitwise contract, 2 on bad input.",
    )
    add_model_flag(audit, "a model preset with seeded random weights (tiny-dense, qwen3-0.6b-random) or a Hugging Face checkpoint directory (default: tiny-dense)",
                   default="tiny-dense")
    add_contract_flag(audit, "the contract (default: the model family's IsoExec contract; 'native' for the fast path)", default=None)
    audit.add_argument("--requests", type=int, metavar="N", help="number of requests (default: 16; with --prompts, one per "
                       "prompt, and more cycle through them again)")
    audit.add_argument("--prompts", metavar="FILE", help='JSONL file of {"prompt": ...} objects ("answer" is allowed and '
                       "ignored): the requests' prompts in place of random tokens, encoded with the --model checkpoint's own "
                       "tokenizer, through its chat template where it has one")
    audit.add_argument("--no-chat-template", action="store_true", help="with --prompts: encode each prompt as raw text, "
                       "not as a user message through the checkpoint's chat template")
    audit.add_argument("--max-new-tokens", type=int, default=16, metavar="T", help="tokens generated per request (default: 16)")
    audit.add_argument("--seed", type=int, default=0, metavar="S", help="seed of prompts, sampling and preset weights (default: 0)")
    audit.add_argument("--engine", choices=("isoexec", "vllm", "vllm-own"), default="isoexec",
                       help="the rollout engine: IsoExec's own (default); vllm, vLLM serving IsoExec's model through its plugin "
                       "(isoexec.vllm, docs/vllm.md); vllm-own, vLLM's own model and sampler, the rollout users have without "
                       "IsoExec (the control). Both vLLM engines need vLLM 0.32 installed and run unsharded")
    add_device_flag(audit, "where to run (default: cpu)")
    add_json_file_flag(audit, "report")
    audit.add_argument("--trace", action="store_true", help="trace the first mismatching token op by op and name the first diverging region")
    audit.add_argument("--trainer-tp", type=int, default=1, metavar="N", help="the trainer's tensor-parallel size: N processes on "
                       "this machine (gloo), each holding its shard; with --device cuda they share the GPU, or with "
                       "ISOEXEC_DIST_BACKEND=nccl each takes a GPU of its own (NCCL) (default: 1)")
    audit.add_argument("--engine-tp", type=int, default=1, metavar="N", help="the engine's tensor-parallel size, likewise (default: 1)")
    audit.add_argument("--trainer-ep", type=int, default=1, metavar="N", help="the trainer's expert-parallel size (an MoE model): the "
                       "routed experts cut over N processes: 1, the trainer's TP size, or TP x DP (the experts over every data-parallel "
                       "group's ranks, SkyRL-IsoExec's TP 4 / EP 8 at --trainer-dp 2) (default: 1)")
    audit.add_argument("--engine-ep", type=int, default=1, metavar="N", help="the engine's expert-parallel size, likewise (TP x DP: "
                       "--engine-dp) (default: 1)")
    audit.add_argument("--trainer-sp", action="store_true", help="sequence parallelism on the trainer's tensor-parallel ranks: each "
                       "holds a shard of the tokens between the row- and the column-parallel projections")
    audit.add_argument("--engine-sp", action="store_true", help="likewise for the engine")
    audit.add_argument("--trainer-dp", type=int, default=1, metavar="N", help="the trainer's data-parallel size: N groups of its "
                       "TP/EP processes, the parameters sharded over them (FSDP2), each scoring its share of the sequences "
                       "(default: 1)")
    audit.add_argument("--engine-dp", type=int, default=1, metavar="N", help="the engine's data-parallel size: N replicas of its "
                       "TP/EP processes, each generating its share of the requests; with --engine-ep TP x N the experts are "
                       "cut over every replica's ranks and the replicas step together (default: 1)")
    add_quiet_flag(audit)
    return audit


def run(args) -> int:
    from ..audit import Tracer, all_equal, render, run_audit
    from ..audit.run import AuditError
    from ..runtime.handshake import HandshakeRefused
    from ..vllm.errors import VllmEngineError
    from .. import parallel
    from ..contract import fit_contract
    from ..model import SpecError, family_of, load_model

    if (args.requests is not None and args.requests < 1) or args.max_new_tokens < 1:
        raise input_error("--requests and --max-new-tokens must be at least 1")
    if args.no_chat_template and args.prompts is None:
        raise input_error("--no-chat-template applies to --prompts only (random prompts are token ids already)")
    sizes = {"--trainer-tp": args.trainer_tp, "--engine-tp": args.engine_tp, "--trainer-ep": args.trainer_ep, "--engine-ep": args.engine_ep,
             "--trainer-dp": args.trainer_dp, "--engine-dp": args.engine_dp}
    if min(sizes.values()) < 1:
        raise input_error(f"{', '.join(sizes)} must be at least 1")
    if max(sizes.values()) > 1 and args.trace:
        raise input_error("parallel sides (--trainer-tp, --engine-tp, --trainer-ep, --engine-ep, --trainer-dp, --engine-dp above 1) run "
                          "without --trace")
    if args.trainer_dp > 1 and args.device != "cpu" and os.environ.get("ISOEXEC_DIST_BACKEND", "gloo") != "nccl":
        from ..audit.run import DP_ON_GPU

        raise input_error(f"--trainer-dp above 1: {DP_ON_GPU}")
    if args.engine != "isoexec":
        if max(args.engine_tp, args.engine_ep, args.engine_dp) > 1 or args.engine_sp or args.trace:
            raise input_error(f"--engine {args.engine} runs unsharded and without --trace (--engine-tp, --engine-ep, --engine-dp, --engine-sp)")
        check_vllm("--engine")
    require_device(args.device)
    check_output_path("--json", args.json)
    family = load(args.contract) if args.contract else None
    try:
        prompts = _file_prompts(args) if args.prompts is not None else None  # before the weights: its errors come cheap
        model = load_model(args.model, seed=args.seed).to(args.device)
    except SpecError as error:
        raise input_error(error) from None
    family = family or load(family_of(model.spec).contract)  # the model family's own contract by default
    contract = fit_contract(family, model.spec, device=args.device, profile=str(args.model))
    check_runnable(contract, args.device)
    for side in ("trainer", "engine"):
        tp, ep, sp = getattr(args, f"{side}_tp"), getattr(args, f"{side}_ep"), getattr(args, f"{side}_sp")
        dp = getattr(args, f"{side}_dp")
        try:
            parallel.check(model.spec, contract, tp, ep, sp, dp)
        except ValueError as error:
            flags = f"--{side}-tp {tp} --{side}-ep {ep}{f' --{side}-sp' if sp else ''}{f' --{side}-dp {dp}' if dp > 1 else ''}"
            raise input_error(f"{flags}: {error}") from None
    tracer = Tracer() if args.trace else None
    requests = args.requests if args.requests is not None else len(prompts) if prompts is not None else 16
    if args.trainer_dp > requests:
        raise input_error(f"--trainer-dp {args.trainer_dp}: each data-parallel group scores at least one of the {requests} requests")
    for side, ranks in (("trainer", parallel.world_of(args.trainer_tp, args.trainer_ep, args.trainer_dp) * args.trainer_dp),
                        ("engine", parallel.world_of(args.engine_tp, args.engine_ep, args.engine_dp) * args.engine_dp)):
        try:
            parallel.backend_for(args.device, ranks)
        except ValueError as error:
            raise input_error(f"the {side}'s {ranks} processes: {error}") from None
    try:
        report = run_audit(model, contract, requests=requests, max_new_tokens=args.max_new_tokens, seed=args.seed,
                           device=args.device, progress=not args.quiet, tracer=tracer, prompts=prompts, trainer_tp=args.trainer_tp,
                           engine_tp=args.engine_tp, trainer_ep=args.trainer_ep, engine_ep=args.engine_ep, trainer_sp=args.trainer_sp,
                           engine_sp=args.engine_sp, trainer_dp=args.trainer_dp, engine_dp=args.engine_dp, engine=args.engine)
    except AuditError as error:
        raise input_error(error) from None
    except VllmEngineError as error:
        raise input_error(error) from None
    except HandshakeRefused as error:  # vLLM's workers do not run what the trainer runs: the readable diff, no traceback
        print(error, file=sys.stderr)
        return EXIT_MISMATCH
    print(render(report))
    if args.json:
        write_text(args.json, json.dumps(report, indent=2))
    return EXIT_OK if all_equal(report) or not contract.claims.is_bitwise else EXIT_MISMATCH


def _file_prompts(args) -> list[list[int]]:
    """--prompts encoded with the tokenizer of the --model checkpoint, through its chat template unless
    --no-chat-template; each prompt checked against the model's length with --max-new-tokens."""
    from ..audit.workload import file_prompts
    from ..model import is_preset, read_config
    from ..rl.tasks.tokenizer import checkpoint_tokenizer

    if is_preset(args.model):
        raise input_error(f"--prompts needs a checkpoint directory for --model, whose tokenizer encodes them; "
                          f"{args.model} is a preset with random weights and no tokenizer")
    if not Path(args.prompts).is_file():
        raise input_error(f"--prompts {args.prompts} {'is a directory' if Path(args.prompts).is_dir() else 'does not exist'}")
    spec = read_config(args.model)  # a SpecError for a folder that is no checkpoint: one line in run
    try:
        tokenizer = checkpoint_tokenizer(args.model, spec, chat_template=not args.no_chat_template)
    except ValueError as error:
        raise input_error(f"--model {error}") from None
    try:
        return file_prompts(args.prompts, tokenizer, max_length=spec.max_position_embeddings, max_new_tokens=args.max_new_tokens)
    except ValueError as error:
        raise input_error(f"--prompts {error}") from None
