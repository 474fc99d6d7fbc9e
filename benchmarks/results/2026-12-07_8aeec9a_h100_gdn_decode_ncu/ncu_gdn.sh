# ncu of one decode step's kernel at batch 1 (Qwen3.5-9B's GDN heads), a graph replay's step at chunk offset 5: the op
# (products), the standalone rows kernel, FLA's recurrent step. Details and per-instruction stall samples.
set -u
pip install -q --no-deps --target /tmp/site build/fla_core-0.6.0-py3-none-any.whl > /dev/null 2>&1
cd benchmarks
export PYTHONPATH=../src:/tmp/site
run() {  # tag, kernel regex, --only label
    timeout 170 ncu --kernel-name "regex:$2" --launch-skip 21 --launch-count 1 --set full --import-source yes -f -o "$OUT/$1" \
        python3 profile_gdn_decode.py --part rows --untimed --batches 1 --only "$3" > "$OUT/$1_log.txt" 2>&1
    ncu -i "$OUT/$1.ncu-rep" --page details > "$OUT/$1_details.txt" 2>&1
    ncu -i "$OUT/$1.ncu-rep" --page source --csv --print-source sass > "$OUT/$1_sass.csv" 2>&1
    rm -f "$OUT/$1.ncu-rep"; tail -2 "$OUT/$1_log.txt"; grep -E "Duration|Registers Per|Achieved Occupancy" "$OUT/$1_details.txt" | head -4
}
run op gdn_fwd_kernel "op, inverse products"
run standalone rows_step_kernel "standalone"
run fla fused_recurrent "fla recurrent"
cd "$OUT" && tar cf logs.tar *_log.txt && rm *_log.txt
