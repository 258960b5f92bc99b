#!/usr/bin/env bash
# Issue 22's GPU runs ("And more": character LM with auxiliary losses, Sparse Transformer
# attention, Quaternion Transformer) on a machine with 4 GPUs, each phase <= 10 minutes.
#
#   bash benchmarks/lectures_more.sh char CORPUS MULTI30K OUT   # every character-LM run (STEPS each)
#   bash benchmarks/lectures_more.sh mt CORPUS MULTI30K OUT     # Multi30k quaternion runs, kernel benchmarks
#   bash benchmarks/lectures_more.sh char-serial CORPUS - OUT   # every character-LM run, one after another on one GPU
#   python benchmarks/char_lm_results.py --collect --out OUT/char_lm
#   python benchmarks/quaternion_mt.py OUT/mt --device 'NVIDIA H200'
#
# CORPUS: train/valid/test.txt from `ctxkit char-corpus` over the 64 files of the Wikipedia
# extract; MULTI30K: the folder of train/val/test_2016_flickr .de/.en. Every run writes its
# results.json and log under OUT; queues run side by side, one GPU each. SMOKE=1 runs toy
# models for a few steps (a CPU check of the script and the code paths).
#
# char  GPU0: T12 (STEPS) -> the LSTM for T12's training time -> T12 w/o the second target
#       GPU1: T12 w/o layer losses -> T12 w/o positions -> T12 quaternion
#       GPU2: T12 strided -> T12 quaternion at about T12's parameters     GPU3: T12 fixed
#       (every Transformer run takes STEPS steps: the ablations and the patterns compare at equal steps)
# char-serial  the same runs one at a time on GPU 0 (RUNS overrides the order), skipping runs whose
#       results.json exists, and starting none that would not end before CALL_S seconds (default 570)
#       from the script's start: call it again on the same OUT to go on within a 10-minute call.
# mt    GPU1-3: Multi30k transformer_3_256_8 / quaternion_3_256_8 / quaternion_3_448_8 for MINUTES each;
#       GPU3 then: the sparse attention kernel benchmark and the distillation speed benchmark
set -uo pipefail
phase=$1 corpus=$2 mt=$3 out=$4
MINUTES=${MINUTES:-2.2} STEPS=${STEPS:-2500}
extra=()
[ "${SMOKE:-0}" = 1 ] && extra=(--smoke --batch-size 4 --eval-chars 3000) && STEPS=${STEPS_SMOKE:-6}
mkdir -p "$out/char_lm" "$out/mt" "$out/logs"
char() {  # char GPU NAME [args...]
  local gpu=$1 name=$2; shift 2
  CUDA_VISIBLE_DEVICES=$gpu python3 benchmarks/char_lm_results.py --corpus "$corpus" --out "$out/char_lm" --run "$name" "${extra[@]}" "$@" \
    > "$out/logs/$name.log" 2>&1 && tail -1 "$out/logs/$name.log" || { echo "FAILED $name"; tail -15 "$out/logs/$name.log"; }
}
steps_of_t12() {  # waits for T12's results, prints its step count
  while [ ! -f "$out/char_lm/t12/results.json" ]; do sleep 5; done
  python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['steps'])" "$out/char_lm/t12/results.json"
}
minutes_of_t12() {
  python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['wall_time_s'] / 60)" "$out/char_lm/t12/results.json"
}
translate() {  # translate GPU PRESET
  local gpu=$1 preset=$2 run="$out/mt/$2"
  CUDA_VISIBLE_DEVICES=$gpu python3 -m ctxkit translate-train --train-src "$mt/train.de" --train-tgt "$mt/train.en" \
    --valid-src "$mt/val.de" --valid-tgt "$mt/val.en" --out "$run" --preset "$preset" --dropout 0.2 --epochs 60 \
    --max-minutes "$MINUTES" --no-progress > "$out/logs/mt_$preset.log" 2>&1 || { echo "FAILED mt $preset"; tail -15 "$out/logs/mt_$preset.log"; return; }
  for beams in 4 1; do
    CUDA_VISIBLE_DEVICES=$gpu python3 -m ctxkit translate "$run" "$mt/test_2016_flickr.de" --ref "$mt/test_2016_flickr.en" \
      --beams $beams > "$run/test2016_beam$beams.txt" 2> "$run/test2016_beam$beams.log"
  done
  echo "mt $preset: $(tail -1 "$out/logs/mt_$preset.log" | head -c 300)"
  tail -n 2 "$run/test2016_beam4.log" "$run/test2016_beam1.log"
}
if [ "$phase" = char ]; then
  (char 0 t12 --steps "$STEPS"; char 0 lstm --minutes "$(minutes_of_t12)"; char 0 t12_no_second_target --steps "$STEPS") &
  (char 1 t12_no_aux_layers --steps "$STEPS"; char 1 t12_no_aux_positions --steps "$STEPS"; char 1 t12_quaternion --steps "$STEPS") &
  (char 2 t12_strided --steps "$STEPS"; char 2 t12_quaternion_wide --steps "$STEPS") &
  (char 3 t12_fixed --steps "$STEPS") &
  wait
elif [ "$phase" = char-serial ]; then
  budget=${CALL_S:-570} last=0
  for name in ${RUNS:-t12 lstm t12_no_second_target t12_no_aux_layers t12_no_aux_positions t12_quaternion t12_strided t12_fixed t12_quaternion_wide}; do
    [ -f "$out/char_lm/$name/results.json" ] && continue
    # A sparse run takes about 2.5x a dense one (its block masks keep it off CUDA graphs).
    estimate=$last; case $name in *strided|*fixed) estimate=$((last * 5 / 2));; esac
    if [ $((SECONDS + estimate)) -gt "$budget" ]; then echo "not started (time): $name"; continue; fi
    start=$SECONDS
    if [ "$name" = lstm ]; then char 0 lstm --minutes "$(minutes_of_t12)"; else char 0 "$name" --steps "$STEPS"; fi
    case $name in *strided|*fixed) ;; *) last=$((SECONDS - start));; esac
  done
elif [ "$phase" = mt ]; then
  (translate 1 transformer_3_256_8) &
  (translate 2 quaternion_3_256_8) &
  (translate 3 quaternion_3_448_8
   CUDA_VISIBLE_DEVICES=3 python3 benchmarks/sparse_attention.py --results "$out/sparse_attention.json" > "$out/logs/sparse_bench.log" 2>&1 \
     || echo "FAILED sparse benchmark"; tail -12 "$out/logs/sparse_bench.log"
   CUDA_VISIBLE_DEVICES=3 python3 benchmarks/distill_speed.py --results "$out/distill_speed.json" > "$out/logs/distill_speed.log" 2>&1 \
     || echo "FAILED distill speed"; cat "$out/logs/distill_speed.log") &
  wait
else
  echo "usage: lectures_more.sh char|char-serial|mt CORPUS MULTI30K OUT" >&2; exit 2
fi
