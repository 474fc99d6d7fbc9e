"""Region-by-region tracing of one token: digests of its row after every op, on both sides.

While tracing, each step's ops are wrapped (`model.context.tracing`) so every op output whose rows are
the step's tokens is digested row by row, keyed by the token's label (request_id << 32 | position).
Both sides call the same ops in the same order for a token, so aligning the two digest lists names
the first op — and the contract region behind it — where the engine and the trainer part ways. A norm
after a residual add returns (normed, new residual stream); the stream is recorded first, as
`<op>.residual`, since it is computed first.
"""

import hashlib
from collections import defaultdict

import torch
from torch import Tensor

from ..model.context import current_step


def _digest(row: Tensor) -> str:
    row = row.detach().contiguous().cpu()
    if row.is_floating_point():
        row = row.view({8: torch.int64, 4: torch.int32, 2: torch.int16}[row.element_size()])
    return hashlib.sha256(row.numpy().tobytes()).hexdigest()[:16]


def _region(contract, op: str, case: str) -> str:
    """The region behind a traced output; a norm's `.residual` output comes from `residual` where the norm
    is pinned in plain `rms_norm` (composed with `residual_add` when bound)."""
    base = op.removesuffix(".residual")
    region = next((e.region for e in contract.composition if base in e.ops and case in e.cases), "?")
    return "residual" if op != base and region == "rms_norm" else region


class Tracer:
    def __init__(self):
        self.records: dict[int, dict[str, list[tuple[str, str]]]] = defaultdict(lambda: defaultdict(list))

    def wrap(self, ops: dict, case: str) -> dict:
        return {name: self._recording(name, fn, case) for name, fn in ops.items()}

    def _recording(self, name: str, fn, case: str):
        def call(*args, **kwargs):
            out = fn(*args, **kwargs)
            labels = current_step().labels
            outputs = [(f"{name}.residual", out[1]), (name, out[0])] if isinstance(out, tuple) else [(name, out)]
            for key, t in outputs:
                if labels is not None and isinstance(t, Tensor) and t.dim() >= 1 and t.shape[0] == labels.shape[0]:
                    for row, label in enumerate(labels.tolist()):
                        self.records[label][case].append((key, _digest(t[row])))
            return out

        return call

    def explain(self, request_id: int, position: int, contract) -> dict:
        """The first op whose output row differs between the engine and trainer_score for this token."""
        sides = self.records.get((request_id << 32) | position, {})
        engine_case = next((c for c in sides if c.startswith("engine")), None)
        engine, trainer = sides.get(engine_case, []), sides.get("trainer_score", [])
        if not engine or not trainer:
            return {"request": request_id, "position": position, "summary": "the token's rows were not traced on both sides"}
        seen: dict[str, int] = defaultdict(int)
        for (op, a), (op_b, b) in zip(engine, trainer):
            index = seen[op]
            seen[op] += 1
            if op != op_b:
                return {"request": request_id, "position": position, "summary": f"the two sides ran different ops ({op} vs {op_b})"}
            if a != b:
                region = _region(contract, op, engine_case)
                return {
                    "request": request_id, "position": position, "op": op, "occurrence": index, "region": region,
                    "engine_case": engine_case, "engine_digest": a, "trainer_digest": b,
                    "summary": f"first diverging op: {op} (call {index} for this token, region {region}) — {engine_case} {a} vs trainer_score {b}",
                }
        return {"request": request_id, "position": position,
                "summary": f"all {min(len(engine), len(trainer))} traced op outputs agree; the difference arises after them (lm_head/logprobs)"}
