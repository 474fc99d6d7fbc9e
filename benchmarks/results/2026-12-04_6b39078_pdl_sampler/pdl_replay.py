"""Decode graph replays (forward + log-probs) and the sampler with programmatic dependent launch on and off,
alternating, in one process; and whether the log-prob rows are the same bits."""
import os, sys, json, torch
sys.path.insert(0, "benchmarks")
from timing import kernel_ms, graphed_ms
from isoexec.ops import triton_support
from isoexec.model import PRESETS, init_random
from isoexec.contract import fit_contract, load
from isoexec.engine import EngineConfig, LLMEngine, SamplingParams
from isoexec.ops.sampling import triton as sampling

CONFIGS = {"off": ("0", "0"), "pdl": ("1", "0"), "pf8": ("1", "8"), "pf16": ("1", "16"), "pf32": ("1", "32")}

def set_pdl(on):
    os.environ["ISOEXEC_PDL"], os.environ["ISOEXEC_PREFETCH"] = CONFIGS[on]
    triton_support.dependent_launches.cache_clear()

dev = torch.device("cuda")
out = {}
for name in sys.argv[1:]:
    model = init_random(PRESETS[name], seed=0).cuda()
    contract = fit_contract(load("tiny-dense-triton"), model.spec, device="cuda")
    engines = {}
    for on in CONFIGS:
        set_pdl(on)
        config = EngineConfig.from_contract(contract, num_pages=64 * 16 + 8, max_num_seqs=64, cuda_graphs=True)
        engine = LLMEngine(model, contract, config, device="cuda")
        engine.generate([[1, 2, 3]], SamplingParams(temperature=1.0, max_tokens=4, ignore_eos=True), progress=False)
        engines[on] = engine
    for b in (1, 64):
        ids = torch.randint(0, 1000, (b,), generator=torch.Generator().manual_seed(b)).cuda()
        pos = torch.full((b,), 100, dtype=torch.int64, device="cuda")
        slots = torch.arange(b * 128, device="cuda").reshape(b, 128)
        write = slots[:, 100].clone()
        rows = {on: engines[on].runner.decode_graphs.run(ids, pos, write, slots)[0].view(torch.int32) for on in CONFIGS}
        same = all(torch.equal(rows[on], rows["off"]) for on in CONFIGS)
        times = {on: [] for on in CONFIGS}
        for _ in range(3):
            for on in CONFIGS:
                g = engines[on].runner.decode_graphs
                times[on].append(kernel_ms(lambda: g.run(ids, pos, write, slots), dev))
        x = rows["off"].view(torch.float32)
        samp = {}
        for on in ("pdl", "off"):
            set_pdl(on)
            args = (x, torch.ones(b, device=dev), torch.zeros(b, dtype=torch.int64, device=dev), torch.ones(b, device=dev),
                    torch.arange(b, device=dev), torch.arange(b, device=dev))
            samp[on] = graphed_ms(lambda: sampling.draw_unfiltered(*args), dev)
        r = dict(replay={on: round(min(t), 4) for on, t in times.items()}, same_bits=same, sample={on: round(t, 4) for on, t in samp.items()})
        out[f"{name} b{b}"] = r
        print(name, b, r, flush=True)
    del engines, model
    torch.cuda.empty_cache()
json.dump(out, open(os.path.join(os.environ["OUT"], "pdl_replay.json"), "w"), indent=1)
