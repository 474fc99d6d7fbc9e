"""Round trips before the first MMA: each LDG's issue index and its first consumer; a load issued after an earlier load's
first consumer starts a new round (the warp waited)."""
import re, sys
lines = [l.split(" ", 1)[1] for l in open(sys.argv[1]).read().splitlines() if l[:1].isdigit()]
first_mma = next(i for i, t in enumerate(lines) if re.search(r"\b(HMMA|HGMMA)", t))
loads = []
for i, t in enumerate(lines[:first_mma]):
    m = re.search(r"LDG\S*\s+(R\d+)", t)
    if m:
        r = int(m.group(1)[1:]); w = 4 if ".128" in t else (2 if ".64" in t else 1)
        regs = {f"R{r + k}" for k in range(w)}
        use = next((j for j in range(i + 1, len(lines)) if any(re.search(rf"\b{x}\b", lines[j].split(",", 1)[1] if "," in lines[j] else "") for x in regs)), None)
        loads.append((i, use, t.strip()[:60]))
rnd, waits = 0, []
for i, use, t in loads:
    while waits and waits[0] < i:
        waits.pop(0); rnd += 1; waits.clear()
    print(f"round {rnd}: issue {i:5d} first use {use}  {t}")
    if use is not None: waits = sorted(waits + [use])
print("first MMA", first_mma)
