import os, sys, torch
a, b = (torch.load(os.path.join(os.environ["OUT"], n)) for n in sys.argv[1:3])
bad = 0
for key, (ya, sa) in a["res"].items():
    yb, sb = b["res"][key]
    iv = {torch.bfloat16: torch.int16, torch.float32: torch.int32}[ya.dtype]
    d = int((ya.view(iv) != yb.view(iv)).sum()) + int((sa.view(iv) != sb.view(iv)).sum())
    bad += d
    if d: print("DIFF", key, d)
print("elements differing:", bad, "of", len(a["res"]), "cases")
for key in a["times"]:
    print("us/launch", key, "old %.2f new %.2f" % (a["times"][key], b["times"][key]))
