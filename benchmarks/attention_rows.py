"""attention.triton's rows (int16 views) for fixed inputs, saved, and two saves compared: whether a change of the
kernel moved any bit, by running each tree on the same inputs (Qwen3-8B's heads, the preset's constants).

    PYTHONPATH=<old tree>/src python3 benchmarks/attention_rows.py save old.pt
    PYTHONPATH=src python3 benchmarks/attention_rows.py save new.pt
    python3 benchmarks/attention_rows.py compare old.pt new.pt      # elements moved per input set

The inputs: packed prefills of 2,048 and 8,192 tokens, one of 2,048 whose queries are scaled by 40 (scores spread
by ~40, so many exps of the walk fall below 2^-126), and decode batches over paged caches (`attention_blocks.case`):
64 x 2,048 (the walk), 1 x 8,192 and 8 x 2,048 (the spread decode).
"""
import pathlib
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).parent))


def save(path: str) -> None:
    import attention_blocks
    from isoexec.ops.attention import triton as attention_triton
    from isoexec.ops.attention.metadata import packed_slot_table

    device = torch.device("cuda")
    generator = torch.Generator(device=device).manual_seed(0)
    op = attention_triton.bench_op()
    rows = {}
    for length, q_scale in ((2048, 1.0), (8192, 1.0), (2048, 40.0)):
        q = (torch.randn(length, 32, 128, generator=generator, device=device) * q_scale).bfloat16()
        k, v = (torch.randn(length, 8, 128, generator=generator, device=device).bfloat16() for _ in range(2))
        call = (q, k, v, *packed_slot_table(torch.tensor([0, length], device=device)), 128**-0.5)
        rows[f"prefill {length} x q*{q_scale:g}"] = op(*call).view(torch.int16).cpu()
    for batch, keys in ((64, 2048), (1, 8192), (8, 2048)):
        call, _, _ = attention_blocks.case(batch, keys, generator, device)
        rows[f"decode {batch} x {keys}"] = op(*call).view(torch.int16).cpu()
    torch.save(rows, path)


def compare(before: str, after: str) -> None:
    a, b = torch.load(before), torch.load(after)
    for name in a:
        print(f"{name:<24} elements {a[name].numel():>9}  moved {int((a[name] != b[name]).sum())}")


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "save":
        save(sys.argv[2])
    elif len(sys.argv) == 4 and sys.argv[1] == "compare":
        compare(sys.argv[2], sys.argv[3])
    else:
        sys.exit(__doc__)
