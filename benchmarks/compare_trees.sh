#!/usr/bin/env bash
# bench.py's engine and trainer sections (SECTIONS) for two source trees in one device call, taking turns
# (before, after, before, after) so drift of the machine shows as the spread between repeats of one
# tree, not as a difference between the trees. BEFORE is a directory holding an older tree's src/ and
# benchmarks/ (e.g. `git archive <commit> src benchmarks | tar -x -C before`); each tree runs its own
# bench.py. Every run writes $OUT/<tree>_<model>_<repeat>.json and .log; BEFORE_COMMIT and AFTER_COMMIT
# name the trees' commits in them.
#
#   OUT=out BEFORE_COMMIT=<sha> AFTER_COMMIT=<sha> bash benchmarks/compare_trees.sh BEFORE [MODEL ...]   # from the repository root
set -u
OUT=${OUT:-compare_out}
BEFORE=$1
shift
MODELS=${*:-qwen3-0.6b-random}
CONTRACTS=${CONTRACTS:-tiny-dense-triton,native}
REPEATS=${REPEATS:-2}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
export PYTHONUNBUFFERED=1
root=$(pwd)
for model in $MODELS; do
    for repeat in $(seq 1 "$REPEATS"); do
        for tree in before after; do
            dir=$root commit=${AFTER_COMMIT:-}
            [ "$tree" = before ] && dir=$root/$BEFORE commit=${BEFORE_COMMIT:-}
            (cd "$dir" && ISOEXEC_COMMIT=$commit PYTHONPATH=src:benchmarks timeout "${RUN_TIMEOUT:-240}" python3 benchmarks/bench.py ${SECTIONS:-engine trainer} --cuda-graphs ${BENCH_ARGS:-} \
                --model "$model" --contracts "$CONTRACTS" --json "$OUT/${tree}_${model}_${repeat}.json") \
                > "$OUT/${tree}_${model}_${repeat}.log" 2>&1
            echo "$tree $model #$repeat: exit $?"
            grep -E "^engine|^trainer" "$OUT/${tree}_${model}_${repeat}.log" | cut -c1-200
        done
    done
done
