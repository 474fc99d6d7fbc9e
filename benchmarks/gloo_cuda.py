"""Which torch.distributed collectives carry CUDA tensors when two ranks share one GPU: gloo, op by op, and NCCL.

    PYTHONPATH=src python3 benchmarks/gloo_cuda.py --json out/gloo_cuda.json

Each backend runs in two fresh processes on cuda:0; each collective is tried with CUDA tensors and its result
checked against what it must give (rank r contributes r + 1). A collective that raises is recorded with the
first line of its error; a backend whose processes do not finish in time is recorded as hung. The parallel
runtime (`parallel/mesh.py`) stages GPU tensors through host memory on gloo whatever this finds; this records
what gloo itself would carry.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
from datetime import timedelta

WORLD = 2


def _collectives(dist, torch, rank: int):
    t = torch.full((4,), float(rank + 1), device="cuda")
    expect_gather = torch.cat([torch.full((4,), float(r + 1)) for r in range(WORLD)])

    def all_gather():
        out = [torch.empty_like(t) for _ in range(WORLD)]
        dist.all_gather(out, t)
        return torch.equal(torch.cat(out).cpu(), expect_gather)

    def all_gather_into_tensor():
        out = torch.empty(4 * WORLD, device="cuda")
        dist.all_gather_into_tensor(out, t)
        return torch.equal(out.cpu(), expect_gather)

    def all_reduce_sum():
        x = t.clone()
        dist.all_reduce(x)
        return bool((x.cpu() == sum(range(1, WORLD + 1))).all())

    def all_reduce_max():
        x = t.clone()
        dist.all_reduce(x, op=dist.ReduceOp.MAX)
        return bool((x.cpu() == WORLD).all())

    def broadcast():
        x = t.clone()
        dist.broadcast(x, 0)
        return bool((x.cpu() == 1).all())

    def reduce_scatter_tensor():
        out = torch.empty(4, device="cuda")
        dist.reduce_scatter_tensor(out, torch.cat([t, t]))
        return bool((out.cpu() == sum(range(1, WORLD + 1))).all())

    def all_to_all_single():
        out = torch.empty(4, device="cuda")
        dist.all_to_all_single(out, torch.arange(4, device="cuda", dtype=torch.float32) + 10 * rank)
        want = torch.tensor([10.0 * r + 2 * rank + i for r in range(WORLD) for i in range(2)])
        return torch.equal(out.cpu(), want)

    def send_recv():
        x = t.clone()
        if rank == 0:
            dist.send(x, 1)
            return True
        dist.recv(x, 0)
        return bool((x.cpu() == 1).all())

    def all_gather_object():
        out = [None] * WORLD
        dist.all_gather_object(out, t)
        return torch.equal(torch.cat([o.cpu() for o in out]), expect_gather)

    return dict(all_gather=all_gather, all_gather_into_tensor=all_gather_into_tensor, all_reduce_sum=all_reduce_sum,
                all_reduce_max=all_reduce_max, broadcast=broadcast, reduce_scatter_tensor=reduce_scatter_tensor,
                all_to_all_single=all_to_all_single, send_recv=send_recv, all_gather_object=all_gather_object)


def _rank(rank: int, backend: str, port: int, queue) -> None:
    import torch
    import torch.distributed as dist

    torch.cuda.set_device(0)
    results = {}
    try:
        store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=60))
        dist.init_process_group(backend, store=store, rank=rank, world_size=WORLD, timeout=timedelta(seconds=60))
    except Exception as error:  # noqa: BLE001 - recorded, not handled
        queue.put((rank, {"init_process_group": f"{type(error).__name__}: {str(error).splitlines()[0][:300]}"}))
        return
    for name, op in _collectives(dist, torch, rank).items():
        try:
            ok = op()
            torch.cuda.synchronize()
            results[name] = "ok" if ok else "wrong result"
        except Exception as error:  # noqa: BLE001
            results[name] = f"{type(error).__name__}: {(str(error).splitlines() or [''])[0][:300]}"
    dist.destroy_process_group()
    queue.put((rank, results))


def probe(backend: str, timeout: float = 180) -> dict:
    import torch.distributed as dist

    # The store is served from here, on a port it keeps until the ranks are done (a port found free and bound later
    # by rank 0 could be taken in between).
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    port = store.port
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    processes = [context.Process(target=_rank, args=(rank, backend, port, queue)) for rank in range(WORLD)]
    for p in processes:
        p.start()
    for p in processes:
        p.join(timeout)
    hung = [p.pid for p in processes if p.is_alive()]
    for p in processes:
        if p.is_alive():
            p.kill()
    got = {}
    while not queue.empty():
        rank, results = queue.get()
        got[f"rank{rank}"] = results
    return {"ranks": got, "hung": bool(hung)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    import torch

    report = {"torch": torch.__version__, "device": torch.cuda.get_device_name(0),
              "gloo": probe("gloo"), "nccl": probe("nccl")}
    text = json.dumps(report, indent=1)
    print(text)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
