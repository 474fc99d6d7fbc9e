"""The execution contract: what it pins, how it is read, and its identities."""

from .diff import Difference, diff_projection
from .fit import arch_of, fit_contract
from .files import dump_json, load, load_file, load_preset, parse, preset_names
from .identity import PROJECTIONS, Identities, canonical_json, identities, sha256_id
from .schema import Case, Claims, Contract, Deployment, Discharge, Entry, ImplRef, Model
from .values import ContractError

__all__ = [
    "PROJECTIONS",
    "Case",
    "Claims",
    "Contract",
    "ContractError",
    "Deployment",
    "Difference",
    "Discharge",
    "Entry",
    "Identities",
    "ImplRef",
    "Model",
    "arch_of",
    "canonical_json",
    "diff_projection",
    "dump_json",
    "fit_contract",
    "identities",
    "load",
    "load_file",
    "load_preset",
    "parse",
    "preset_names",
    "sha256_id",
]
