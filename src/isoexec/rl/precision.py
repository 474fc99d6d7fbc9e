"""Float32 master weights for a policy that computes in bfloat16 (the RL loop on a GPU).

The optimiser steps float32 copies of the parameters; after each step every parameter is the round-to-nearest
bfloat16 of its master. AdamW's updates are often below half a bfloat16 ulp of the weight they change, and would
vanish if applied to the bfloat16 parameters themselves. The engine receives the bfloat16 parameters, the same
tensors the trainer computes with, so the two sides still hold the same weights bit for bit.
"""

import torch


class MasterWeights:
    def __init__(self, model: torch.nn.Module):
        self.model = model
        self.params = {name: torch.nn.Parameter(p.detach().float().clone()) for name, p in model.named_parameters()}

    def named_parameters(self):
        return self.params.items()

    def parameters(self):
        return self.params.values()

    def take_grads(self) -> None:
        """The policy's gradients, in float32, onto the masters (the policy's are dropped)."""
        for name, p in self.model.named_parameters():
            self.params[name].grad = None if p.grad is None else p.grad.float()
            p.grad = None

    def write_back(self) -> None:
        """Each parameter rounded from its stepped master."""
        with torch.no_grad():
            for name, p in self.model.named_parameters():
                p.copy_(self.params[name])
