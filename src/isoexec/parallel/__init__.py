"""Parallelism applied from outside the model: a side's mesh, the plan of which shard each rank holds, and
the contract ops composed with the collectives a shard needs. The model code never sees the layout."""

from .mesh import Mesh, backend_for, spawn, world_of
from .ops import compose
from .plan import check, local_spec, random_shard, shard

__all__ = ["Mesh", "backend_for", "check", "compose", "local_spec", "random_shard", "shard", "spawn", "world_of"]
