"""The trainer/engine handshake: exchange fingerprints, refuse on anything that could change bits.

Both sides run the same symmetric `check` on the pair (ordered trainer, engine), so they reach the
same verdict independently; the verdicts are then exchanged too, and either side's refusal stops both.
"""

import json
from dataclasses import dataclass, field
from datetime import timedelta

from ..contract.diff import ABSENT, Difference, diff_projection, render_grouped
from ..contract.identity import canonical_json

# Runtime fields that decide bits for the same source: a different compiler, library or ISA may
# generate different arithmetic, so these must match exactly.
_BIT_DECIDING_RUNTIME = (("torch",), ("triton",), ("device", "type"), ("device", "arch"), ("device", "isa"))
_INFORMATIONAL_RUNTIME = (("python",), ("device", "name"))


class HandshakeRefused(RuntimeError):
    def __init__(self, verdict: "Verdict"):
        super().__init__(verdict.report())
        self.verdict = verdict


@dataclass
class Verdict:
    ok: bool
    problems: list[Difference] = field(default_factory=list)
    notes: list[Difference] = field(default_factory=list)

    def report(self) -> str:
        head = "IsoExec handshake: " + ("accepted" if self.ok else f"REFUSED ({len(self.problems)} problems)")
        lines = [head] + ["  " + line for line in render_grouped(self.problems)]
        if self.notes:
            lines += ["notes (do not change bits):"] + ["  " + line for line in render_grouped(self.notes)]
        return "\n".join(lines)

    def to_dict(self) -> dict:
        return {
            "ok": self.ok,
            "problems": [p.to_dict() for p in self.problems],
            "notes": [n.to_dict() for n in self.notes],
        }

    def raise_if_refused(self) -> "Verdict":
        if not self.ok:
            raise HandshakeRefused(self)
        return self


def _dig(tree: dict, path: tuple):
    for key in path:
        if not isinstance(tree, dict) or key not in tree:
            return ABSENT
        tree = tree[key]
    return tree


def check_installed(fp: dict) -> list[Difference]:
    """Where the process of `fp` does not run what its own contract pins for its cases."""
    role, out = fp["role"], []
    pinned = fp["contract"]["numerical_policy"]["regions"]
    installed = fp["installed"]

    def problem(region, case, name, expected, actual):
        return Difference("installed", name, expected, actual, region=region, case=case, a_name="contract", b_name=role)

    for region, cells in sorted(pinned.items()):
        for case, cell in sorted(cells.items()):
            if case not in fp["cases"]:
                continue
            have = _dig(installed, (region, case))
            if have is ABSENT:
                out.append(problem(region, case, "impl", cell["impl"], ABSENT))
            elif have["impl"] != cell["impl"]:
                out.append(problem(region, case, "impl", cell["impl"], have["impl"]))
            elif have["source_sha256"] is None:
                out.append(problem(region, case, "source_sha256", "readable source", None))
            elif fp["guarantees"]["bitwise"] and cell["discharge"]["method"] == "bitwise_equal_to" and not have.get("admitted"):
                out.append(problem(region, case, "admitted", "an admission record (run isoexec validate)", False))
    for region, cells in sorted(installed.items()):
        for case, have in sorted(cells.items()):
            if _dig(pinned, (region, case)) is ABSENT:
                out.append(problem(region, case, "impl", ABSENT, have["impl"]))
    claims = fp["guarantees"]
    if claims["bitwise"]:
        for name in ("tp", "ep", "sp"):
            allowed, value = claims["topology"][name], fp["parallel"].get(name)
            if value not in allowed:
                out.append(Difference("parallel", name, allowed, value, a_name="claims", b_name=role))
    return out


def _sources(fp: dict) -> dict[str, tuple[str, str, str]]:
    """impl ref -> (source hash, one region, one case) for every impl a process runs."""
    out = {}
    for region, cells in sorted(fp["installed"].items()):
        for case, have in sorted(cells.items()):
            out.setdefault(have["impl"], (have["source_sha256"], region, case))
    return out


def check(a: dict, b: dict) -> Verdict:
    """Compare two fingerprints; refuse on every difference that can change a bit."""
    if a.get("role") == b.get("role"):
        same = Difference("role", "role", a.get("role"), b.get("role"), a_name="local", b_name="peer")
        return Verdict(False, [same])
    if a["role"] != "trainer":
        a, b = b, a
    names = {"a_name": "trainer", "b_name": "engine"}
    problems = check_installed(a) + check_installed(b)
    notes = []
    if a.get("fingerprint_version") != b.get("fingerprint_version"):
        problems.append(Difference("fingerprint", "fingerprint_version", a.get("fingerprint_version"), b.get("fingerprint_version"), **names))
        return Verdict(False, problems)
    ids_a, ids_b = a["contract"]["identities"], b["contract"]["identities"]
    for scope in ("semantic", "numerical_policy"):
        if ids_a[scope] != ids_b[scope]:
            found = diff_projection(scope, a["contract"][scope], b["contract"][scope], **names)
            problems += found or [Difference(scope, "identity", ids_a[scope], ids_b[scope], **names)]
    if ids_a["deployment"] != ids_b["deployment"]:
        notes.append(Difference("deployment", "identity", ids_a["deployment"], ids_b["deployment"], **names))
    sources_a, sources_b = _sources(a), _sources(b)
    for ref in sorted(set(sources_a) & set(sources_b)):
        (hash_a, region, case), (hash_b, _, _) = sources_a[ref], sources_b[ref]
        if hash_a != hash_b:
            problems.append(Difference("source", f"{ref} source_sha256", hash_a, hash_b, region=region, case=case, **names))
    for path in _BIT_DECIDING_RUNTIME + _INFORMATIONAL_RUNTIME:
        va, vb = _dig(a["runtime"], path), _dig(b["runtime"], path)
        if va != vb:
            found = Difference("runtime", ".".join(path), va, vb, **names)
            (problems if path in _BIT_DECIDING_RUNTIME else notes).append(found)
    return Verdict(not problems, problems, notes)


def handshake(local: dict, exchange) -> Verdict:
    """Run the handshake for the process fingerprinted by `local`.

    `exchange(topic, payload: bytes) -> bytes` publishes this side's payload under `topic` and returns
    the peer's; `store_exchange` builds one over any torch.distributed store (TCPStore, FileStore).
    """
    raw = exchange("fingerprint", canonical_json(local))
    try:
        remote = json.loads(raw)
        verdict = check(local, remote)
    except (ValueError, KeyError, TypeError, AttributeError) as error:
        unreadable = Difference("fingerprint", "payload", "a fingerprint", f"unreadable ({error})", a_name="expected", b_name="peer sent")
        verdict = Verdict(False, [unreadable])
    peer = exchange("verdict", b"accept" if verdict.ok else b"refuse")
    if verdict.ok and peer != b"accept":
        verdict = Verdict(False, [Difference("verdict", "peer", "accept", peer.decode("utf-8", "replace"), a_name="local", b_name="peer")], verdict.notes)
    return verdict


def store_exchange(store, role: str, peer_role: str, *, timeout_s: float = 60.0, prefix: str = "isoexec/handshake"):
    """An `exchange` over a torch.distributed Store; each topic is one key per role."""

    def exchange(topic: str, payload: bytes) -> bytes:
        store.set(f"{prefix}/{topic}/{role}", payload)
        key = f"{prefix}/{topic}/{peer_role}"
        store.wait([key], timedelta(seconds=timeout_s))
        return bytes(store.get(key))

    return exchange
