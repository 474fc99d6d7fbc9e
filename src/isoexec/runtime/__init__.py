"""What a process actually runs: the impl registry, its fingerprint, and the handshake."""

from .fingerprint import device_info, fingerprint, runtime_info
from .handshake import HandshakeRefused, Verdict, check, check_installed, handshake, store_exchange
from .registry import REGISTRY, Impl, Registry, ResolutionError

__all__ = [
    "REGISTRY",
    "HandshakeRefused",
    "Impl",
    "Registry",
    "ResolutionError",
    "Verdict",
    "check",
    "check_installed",
    "device_info",
    "fingerprint",
    "handshake",
    "runtime_info",
    "store_exchange",
]
