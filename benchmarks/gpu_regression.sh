#!/usr/bin/env bash
# GPU regression check of a structural change: run the four GPU benchmarks on one tree
# (a tree from before fast plans runs its benchmarks' variant names, a newer one the same
# configurations as plan strings; benchmarks/gpu_regression.py matches the figures by case).
#
#   bash benchmarks/gpu_regression.sh TREE OUTDIR TOKENIZER_DIR DATA_DIR
#
# TREE is a checkout (its src/ and benchmarks/ are used); run it on the tree before and on
# the tree after the change in the same session, on the same card, then compare with
#   python benchmarks/gpu_regression.py BEFORE_OUTDIR AFTER_OUTDIR
# TOKENIZER_DIR holds an uncased BERT WordPiece vocabulary with config.json of
# all-MiniLM-L6-v2; a model with that shape and seeded random weights is written beside it
# (speed does not depend on the weights, and both trees load the same file).
set -euo pipefail
tree=$1 out=$2 tok=$3 data=$4
mkdir -p "$out"
model="$out/../minilm_random"
if [ ! -f "$model/model.safetensors" ]; then
  mkdir -p "$model" && cp "$tok"/* "$model"/
  python3 - "$model" <<'EOF'
import sys, torch
from transformers import BertConfig, BertModel
torch.manual_seed(0)
folder = sys.argv[1]
BertModel(BertConfig.from_pretrained(folder)).save_pretrained(folder, safe_serialization=True)
EOF
fi
cd "$tree"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"  # the tree's own ctxkit, installed or not
run() { local name=$1; shift; echo "== $name"; local t0=$SECONDS; "$@" > "$out/$name.log" 2>&1 || { tail -20 "$out/$name.log"; return 1; }; tail -4 "$out/$name.log"; echo "   ($((SECONDS - t0)) s)"; }
if [ -f src/ctxkit/fast/plan.py ]; then
  # A tree with fast plans: the same work as the configurations below, named as plans.
  run pretrain python3 benchmarks/pretrain_throughput.py --fast graphs+compile+qkv+bf16res --no-compile --results "$out/pretrain_throughput.json"
  run inference python3 benchmarks/inference_gpu.py --batch 1 256 --fast graphs+qkv,graphs+compile+qkv --tokenizer "$model" --data "$data/glue/SST-2" --results "$out/inference_gpu.json"
  run generate python3 benchmarks/generate.py --device cuda --batch 1 16 --no-peer --fast graphs+qkv,graphs+compile+qkv,decode --results "$out/generate.json"
  run finetune python3 benchmarks/finetune_vs_hf.py --data "$data" --model "$model" --tasks sst-2 --fast graphs+qkv --results "$out/finetune_vs_hf.json"
else
  run pretrain python3 benchmarks/pretrain_throughput.py --variants graphs+compile-model+bf16res --no-compile --results "$out/pretrain_throughput.json"
  run inference python3 benchmarks/inference_gpu.py --batch 1 256 --variants graphs 'graphs + compile' --tokenizer "$model" --data "$data/glue/SST-2" --results "$out/inference_gpu.json"
  run generate python3 benchmarks/generate.py --device cuda --batch 1 16 --no-peer --results "$out/generate.json"
  run finetune python3 benchmarks/finetune_vs_hf.py --data "$data" --model "$model" --tasks sst-2 --results "$out/finetune_vs_hf.json"
fi
