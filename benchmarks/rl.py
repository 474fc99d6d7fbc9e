"""bench.py's rl section: whole synchronous RL steps (rollout, trainer recompute and update, weight sync) under
each contract, side by side in one run, on one device (or, with --rl-layout, each side at its own parallel layout
over this machine's GPUs or CPUs).

Each contract runs the same config from the same seeded weights: GRPO (every group trained on), a model preset
over its own vocabulary (`RLConfig.model_vocab`: a real lm_head and log-prob width, and a random policy that
rarely stops early, so completions run to max_new_tokens), no warm-up. The gate holds the sampled tokens'
log-probs (`gate_full_rows` off: returning every full-vocabulary row would move gigabytes a step to the host and
time the transfer, not the step; the audits check full rows). One step first compiles, captures graphs and admits
the contract on this machine; the steps after it are timed by their phases (`RLRun.run_step`'s metrics), and the
contracts take turns step by step so that drift in the host reaches each alike.
"""

from __future__ import annotations

import gc
import statistics

import torch

from isoexec.rl import RLConfig
from isoexec.rl.parallel_mode import start_run

PHASES = ("step", "generate", "train", "sync")


def bench_rl(device: torch.device, models: tuple[str, ...], contracts: dict[str, str], *, prompts: int, group: int, new_tokens: int,
             steps: int, layout: dict | None = None) -> dict:
    """contracts: label -> preset name or contract file, the one under test first. Per model: each contract's
    median phase seconds, its gate's bitwise fraction per step, and the first contract's time over each other's
    per phase (`<a>_time_over_<b>_<phase>`: a time ratio, as issue 21's step goal reads, not bench.py's speed ratio)."""
    results = {}
    for model in models:
        base = RLConfig(model=model, model_vocab=True, device=device.type, algorithm="grpo", prompts_per_step=prompts, group_size=group,
                        max_new_tokens=new_tokens, warmup_steps=0, steps=steps + 1, gate_full_rows=False, **(layout or {}))
        runs, row = {}, {"model": model, "sequences": prompts * group, "max_new_tokens": new_tokens, "timed_steps": steps,
                         "layout": {"trainer": base.layout("trainer"), "engine": base.layout("engine")}}
        for label, contract in contracts.items():
            try:
                runs[label] = start_run(base.replace(contract=contract))  # each side in processes of its own at a parallel layout
                runs[label].run_step()  # compiles, captures, admits
                row[f"{label}_engine_cuda_graphs"] = runs[label].contract.deployment.engine.cuda_graphs  # the contract's own deployment
            except (RuntimeError, ValueError) as error:  # out of memory, a contract the model cannot run
                row[f"{label}_error"] = str(error).splitlines()[0]
                print(f"rl {model} {label}: failed ({row[f'{label}_error']})", flush=True)
                runs.pop(label, None)
        history = {label: [] for label in runs}
        for _ in range(steps):
            for label, run in runs.items():
                history[label].append(run.run_step())
        for label, metrics in history.items():
            for phase in PHASES:
                row[f"{label}_{phase}_s"] = statistics.median(m[f"{phase}_seconds"] for m in metrics)
            row[f"{label}_tokens"] = [m.get("tokens", 0) for m in metrics]
            row[f"{label}_bitwise_equal_fraction"] = [m.get("bitwise_equal_fraction") for m in metrics]
        labels = list(contracts)
        for other in labels[1:]:
            for phase in PHASES:
                if f"{labels[0]}_{phase}_s" in row and f"{other}_{phase}_s" in row:
                    row[f"{labels[0]}_time_over_{other}_{phase}"] = row[f"{labels[0]}_{phase}_s"] / row[f"{other}_{phase}_s"]
        for label in runs:
            print(f"rl {model} {label}: " + "  ".join(f"{phase} {row[f'{label}_{phase}_s']:.3f} s" for phase in PHASES)
                  + f"  bitwise {row[f'{label}_bitwise_equal_fraction']}", flush=True)
        print("".join(f"rl {model} {k} {v:.3f}\n" for k, v in row.items() if "_time_over_" in k), end="", flush=True)
        for run in runs.values():
            run.close()
        runs = None
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
        results[model] = row
    return results
