"""One side (trainer or engine) of a handshake, run as its own process by test_handshake.py.

It registers a stand-in impl under every id the contract names (the op library arrives with its own
issue), resolves the contract for its role, optionally swaps one cell's impl to simulate a process that
runs something other than what the contract says, and performs the handshake over a TCPStore.
"""

import argparse
import json
import sys
from datetime import timedelta

import torch.distributed as dist

from isoexec.contract import load
from isoexec.runtime import Impl, Registry, fingerprint, handshake, runtime_info, store_exchange
from isoexec.validate import records


def stand_in(*args, **kwargs):
    raise NotImplementedError("handshake tests never call an impl")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--role", choices=("trainer", "engine"), required=True)
    parser.add_argument("--contract", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--swap", help="REGION/CASE=ID@VERSION: run this impl in that cell instead")
    args = parser.parse_args()

    contract = load(args.contract)
    registry = Registry()
    for entry in {(e.impl.id, e.impl.version, e.region) for e in contract.composition}:
        registry.register(Impl(id=entry[0], version=entry[1], region=entry[2], cases=frozenset(contract.cases), fn=stand_in))
    installed = registry.resolve(contract, contract.cases_of(args.role))
    # This test is about the handshake, not the battery: declare the stand-ins admitted (the test points
    # ISOEXEC_HOME at a temporary folder).
    for (region, case), impl in installed.items():
        records.write(impl, contract.entry(region, case).constants, runtime_info("cpu"), cases=[case], status="admitted", dtypes=[], trials=0, failures=[])
    if args.swap:
        cell, ref = args.swap.split("=")
        region, case = cell.split("/")
        impl_id, version = ref.split("@")
        installed[region, case] = Impl(id=impl_id, version=int(version), region=region, cases=frozenset([case]), fn=stand_in)
    local = fingerprint(contract, installed, role=args.role)

    # The store is served by the test (a port it holds: found free here and bound later, another process could take it).
    store = dist.TCPStore("127.0.0.1", args.port, is_master=False, timeout=timedelta(seconds=60))
    peer = "engine" if args.role == "trainer" else "trainer"
    verdict = handshake(local, store_exchange(store, args.role, peer, timeout_s=60))
    print(json.dumps({"role": args.role, **verdict.to_dict(), "report": verdict.report()}))
    return 0 if verdict.ok else 1


if __name__ == "__main__":
    sys.exit(main())
