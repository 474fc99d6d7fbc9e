"""A short supervised warm-up on the task's answers, so RL starts from a policy that answers in format.

It runs on the native fast path: only the RL steps need the trainer and the engine to agree. By
default it runs for the built-in toy only (`RLConfig.num_warmup_steps`): a checkpoint already writes text.
"""

import random

import torch

from ..contract import fit_contract, load_preset
from ..model import Decoder
from ..trainer import Trainer

WARMUP_BATCH = 64


def warmup(model: Decoder, task, config) -> Decoder:
    if config.num_warmup_steps == 0:
        return model
    model = model.to(config.device)
    trainer = Trainer(model, fit_contract(load_preset("native"), model.spec, device=config.device))
    tok = task.tokenizer
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.warmup_learning_rate)
    for i in range(config.num_warmup_steps):
        examples = task.sample(random.Random(f"{config.seed}:warmup:{i}"), WARMUP_BATCH)
        prompts = [tok.encode_prompt(e.prompt) for e in examples]
        targets = [tok.encode(e.answer) + [tok.EOS] for e in examples]
        rows = trainer.logprobs([p + t for p, t in zip(prompts, targets)], case="trainer_fwd", device=config.device)
        picked = [r[len(p) - 1 :].gather(-1, torch.tensor(t, device=config.device)[:, None]) for r, p, t in zip(rows, prompts, targets)]
        loss = -torch.cat(picked).mean()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip)
        optimizer.step()
    return model
