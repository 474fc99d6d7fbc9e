"""Parameter holders named as in Hugging Face checkpoints, so `state_dict()` keys are the checkpoint's;
sibling projections of one input kept joined in memory and called through `project`."""

import torch
from torch import Tensor, nn

from ...ops.linear.joined import joined
from ..context import current_step


class Linear(nn.Module):
    def __init__(self, in_features: int, out_features: int, bias: bool, dtype: torch.dtype):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(out_features, in_features, dtype=dtype))
        self.bias = nn.Parameter(torch.empty(out_features, dtype=dtype)) if bias else None


class Norm(nn.Module):
    def __init__(self, size: int, dtype: torch.dtype):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size, dtype=dtype))


class Embedding(nn.Module):
    def __init__(self, num_embeddings: int, size: int, dtype: torch.dtype):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(num_embeddings, size, dtype=dtype))


def join(*linears: Linear) -> None:
    """Keep the linears' weights (and biases) as consecutive rows of one tensor each, values unchanged:
    a joined op (`runtime/binding.SIBLINGS`) then runs them as one call. Each stays a Parameter of its
    own (its own name, gradient and optimiser state); a conversion that copies them apart
    (`Module.to`) is followed by another join (`Decoder._apply`)."""
    for attr in ("weight", "bias"):
        params = [getattr(linear, attr) for linear in linears]
        if params[0] is None or joined(params) is not None:
            continue
        first = params[0]
        whole = torch.empty((sum(p.shape[0] for p in params), *first.shape[1:]), dtype=first.dtype, device=first.device)
        start = 0
        for p in params:
            part = whole[start : start + p.shape[0]]
            part.copy_(p.detach())
            p.data = part
            start += p.shape[0]


def project(names: tuple[str, ...], x: Tensor, *linears: Linear) -> list[Tensor]:
    """x through each of the sibling projections `names` (their weights in `linears`): one joined call where
    the contract's binding has one for them and their weights are joined, else one call each; the bits
    are the same either way for an invariant impl (`ops/linear/joined.py`)."""
    ops = current_step().ops
    op = ops.get("+".join(names))
    if op is not None:
        out = op(x, [linear.weight for linear in linears], [linear.bias for linear in linears])
        if out is not None:
            return out
    return [ops[name](x, linear.weight, linear.bias) for name, linear in zip(names, linears)]


def join_all(module: nn.Module) -> None:
    """`join` every sibling group of every layer under `module` that names them (`SIBLINGS` attribute)."""
    for layer in module.modules():
        for names in getattr(layer, "SIBLINGS", ()):
            join(*(getattr(layer, name) for name in names))
