"""Stall samples of an ncu source page (--page source --csv --print-source sass): totals by reason, and by region of the
code (split at the first MMA and at given instruction indices)."""
import csv, re, sys, collections
path = sys.argv[1]
rows = list(csv.reader(open(path)))
head = rows[1]; body = [r for r in rows[2:] if len(r) == len(head)]
col = {n: i for i, n in enumerate(head)}
reasons = [n for n in head if n.startswith("stall_") and "Not Issued" not in n]
total = sum(float(r[col["Warp Stall Sampling (All Samples)"]] or 0) for r in body)
first_mma = next((i for i, r in enumerate(body) if re.search(r"HMMA|HGMMA", r[col["Source"]])), len(body))
by = collections.Counter()
for r in body:
    for n in reasons:
        by[n] += float(r[col[n]] or 0)
print(f"{path}: {len(body)} instructions, {total:.0f} samples, first MMA at {first_mma}")
print("  by reason:", ", ".join(f"{n[6:]} {v / total:.0%}" for n, v in by.most_common(8)))
cuts = [0, first_mma] + [int(x) for x in sys.argv[2:]] + [len(body)]
cuts = sorted(set(cuts))
for a, b in zip(cuts, cuts[1:]):
    seg = body[a:b]
    s = sum(float(r[col["Warp Stall Sampling (All Samples)"]] or 0) for r in seg)
    segby = collections.Counter()
    for r in seg:
        for n in reasons:
            segby[n] += float(r[col[n]] or 0)
    print(f"  [{a:5d}, {b:5d}): {s / total:5.1%}  " + ", ".join(f"{n[6:]} {v / total:.1%}" for n, v in segby.most_common(4)))
# the top instructions
top = sorted(body, key=lambda r: -float(r[col["Warp Stall Sampling (All Samples)"]] or 0))[:14]
for r in top:
    i = body.index(r)
    s = float(r[col["Warp Stall Sampling (All Samples)"]] or 0)
    main = max(reasons, key=lambda n: float(r[col[n]] or 0))
    print(f"   {i:5d} {s / total:5.1%} {main[6:]:10s} {r[col['Source']][:90]}")
