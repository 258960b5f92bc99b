"""ctxkit vs Hugging Face transformers: the same fine-tuning, same checkpoint, same
hyper-parameters, same GPU, one process.

    python benchmarks/finetune_vs_hf.py --data ../shared/data --model DIR_OR_NAME

Tasks: SST-2 (accuracy), CoNLL-2003 (entity F1, dev), SQuAD v1.1 article split (F1 on
qa-eval). The HF side follows the official example scripts' logic: ``Trainer`` with
``DataCollatorWithPadding`` / ``DataCollatorForTokenClassification``, first-sub-word NER
labels, and run_qa.py's windowing (``truncation="only_second"``, ``stride`` = overlap,
``padding="max_length"``) and n-best post-processing. Both sides are scored by the same
metric code (ctxkit.tasks.metrics, which follows the official scripts). Wall time runs from
loading the model to having the dev score (tokenisation, training, evaluation).

Prints a table and writes speed and quality records to
benchmarks/results/finetune_vs_hf.json.
"""

from __future__ import annotations

import argparse
import collections
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from harness import command_line, device_name, speed_record, today, write_records

from ctxkit.tasks.metrics import accuracy, ner_f1, squad_v1

REPO = Path(__file__).resolve().parents[1]

HYPER = {  # shared by both sides
    "sst-2": dict(epochs=1, batch_size=32, lr=1e-4, max_length=128),
    "conll2003": dict(epochs=3, batch_size=32, lr=1e-4, max_length=256),
    "squad": dict(epochs=2, batch_size=32, lr=1e-4, max_length=384, stride=128),
}


# ------------------------------------------------------------------------ ctxkit side


LIMIT = 0  # --limit: smoke test on the first N examples of each split


def _cut(examples):
    return examples[:LIMIT] if LIMIT else examples


def _sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def run_ctxkit(task_name: str, model: str, data: Path, hp: dict, fast: str = "auto") -> dict:
    from ctxkit.tasks import finetune, get_task
    from ctxkit.training import TrainConfig

    options = {"max_seq_len": hp["max_length"], "doc_stride": hp["stride"]} if task_name == "squad" else {"max_length": hp["max_length"]}
    task = get_task(task_name, **options)
    # Like the HF side (save_strategy="no", eval_strategy="no"): no resumable checkpoints,
    # one evaluation at the end.
    cfg = TrainConfig(epochs=hp["epochs"], batch_size=hp["batch_size"], lr=hp["lr"], warmup_ratio=0.1, weight_decay=0.01,
                      progress=False, log_every=200, eval_each_epoch=False, save_checkpoints=False, fast=fast)
    _sync()
    t0 = time.time()
    with tempfile.TemporaryDirectory() as out:
        summary = finetune(task, model, data, out, cfg, limit_train=LIMIT or None, limit_eval=LIMIT or None)
    _sync()
    wall = time.time() - t0
    print(f"  ctxkit timings: {summary['timings_s']}", flush=True)
    return {"score": summary["results"][task.eval_splits[0]][task.main_metric], "wall_s": wall, "fast": summary.get("fast")}


# ------------------------------------------------------------------------ HF side


def _hf_args(out: str, hp: dict):
    import inspect

    from transformers import TrainingArguments

    # transformers 5 folded warmup_ratio into warmup_steps (a float < 1 is a ratio).
    warmup = {"warmup_ratio": 0.1} if "warmup_ratio" in inspect.signature(TrainingArguments).parameters else {"warmup_steps": 0.1}
    return TrainingArguments(
        output_dir=out, per_device_train_batch_size=hp["batch_size"], per_device_eval_batch_size=128,
        learning_rate=hp["lr"], num_train_epochs=hp["epochs"], weight_decay=0.01, **warmup,
        lr_scheduler_type="linear", max_grad_norm=1.0, bf16=torch.cuda.is_available(), use_cpu=not torch.cuda.is_available(), logging_steps=200, save_strategy="no",
        eval_strategy="no", report_to="none", seed=42, disable_tqdm=True,
    )


def run_hf_sst2(model_dir: str, data: Path, hp: dict) -> dict:
    from transformers import AutoModelForSequenceClassification, AutoTokenizer, DataCollatorWithPadding, Trainer

    from ctxkit.data import read_glue

    t0 = time.time()
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForSequenceClassification.from_pretrained(model_dir, num_labels=2)
    train, dev = _cut(read_glue("SST-2", data, "train")), _cut(read_glue("SST-2", data, "dev"))

    def encode(examples):
        enc = tok([e.text for e in examples], truncation=True, max_length=hp["max_length"])
        return [{"input_ids": i, "token_type_ids": t, "attention_mask": a, "labels": e.label}
                for i, t, a, e in zip(enc["input_ids"], enc["token_type_ids"], enc["attention_mask"], examples)]

    with tempfile.TemporaryDirectory() as out:
        trainer = Trainer(model=model, args=_hf_args(out, hp), train_dataset=encode(train), data_collator=DataCollatorWithPadding(tok))
        trainer.train()
        logits = trainer.predict(encode(dev)).predictions
    _sync()
    wall = time.time() - t0
    return {"score": accuracy(logits.argmax(-1), [e.label for e in dev])["accuracy"], "wall_s": wall}


def run_hf_conll(model_dir: str, data: Path, hp: dict) -> dict:
    from transformers import AutoModelForTokenClassification, AutoTokenizer, DataCollatorForTokenClassification, Trainer

    from ctxkit.data import label_list, read_conll

    t0 = time.time()
    train, dev = _cut(read_conll(data / "train.txt")), _cut(read_conll(data / "valid.txt"))
    labels = label_list(train)
    label_to_id = {l: i for i, l in enumerate(labels)}
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForTokenClassification.from_pretrained(model_dir, num_labels=len(labels))

    def encode(sentences):
        enc = tok([s.words for s in sentences], is_split_into_words=True, truncation=True, max_length=hp["max_length"])
        feats, word_ids_all = [], []
        for i, s in enumerate(sentences):
            word_ids = enc.word_ids(i)
            previous, aligned = None, []
            for w in word_ids:  # run_ner.py: label the first sub-word, -100 elsewhere
                aligned.append(-100 if w is None or w == previous else label_to_id[s.tags[w]])
                previous = w
            feats.append({"input_ids": enc["input_ids"][i], "token_type_ids": enc["token_type_ids"][i],
                          "attention_mask": enc["attention_mask"][i], "labels": aligned})
            word_ids_all.append(word_ids)
        return feats, word_ids_all

    train_feats, _ = encode(train)
    dev_feats, dev_word_ids = encode(dev)
    with tempfile.TemporaryDirectory() as out:
        trainer = Trainer(model=model, args=_hf_args(out, hp), train_dataset=train_feats, data_collator=DataCollatorForTokenClassification(tok))
        trainer.train()
        logits = trainer.predict(dev_feats).predictions
    preds = []
    for s, word_ids, lg in zip(dev, dev_word_ids, logits):
        tags, previous = ["O"] * len(s.words), None
        for pos, w in enumerate(word_ids):
            if w is not None and w != previous:
                tags[w] = labels[int(lg[pos].argmax())]
            previous = w
        preds.append(tags)
    _sync()
    wall = time.time() - t0
    return {"score": ner_f1([s.tags for s in dev], preds)["f1"], "wall_s": wall}


def run_hf_squad(model_dir: str, data: Path, hp: dict) -> dict:
    from transformers import AutoModelForQuestionAnswering, AutoTokenizer, Trainer, default_data_collator

    from ctxkit.data import read_squad
    from ctxkit.tasks.qa import split_articles_in_order

    t0 = time.time()
    train, dev = map(_cut, split_articles_in_order(read_squad(data / "dev-v1.1.json.zip"), 38))
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForQuestionAnswering.from_pretrained(model_dir)
    kw = dict(truncation="only_second", max_length=hp["max_length"], stride=hp["stride"], return_overflowing_tokens=True,
              return_offsets_mapping=True, padding="max_length")

    def train_features(examples):
        enc = tok([e.question.lstrip() for e in examples], [e.context for e in examples], **kw)
        feats = []
        for i, offsets in enumerate(enc["offset_mapping"]):
            ex = examples[enc["overflow_to_sample_mapping"][i]]
            seq = enc.sequence_ids(i)
            start_char = ex.answers[0].start
            end_char = start_char + len(ex.answers[0].text)
            ts = seq.index(1)
            te = len(seq) - 1 - seq[::-1].index(1)
            if not (offsets[ts][0] <= start_char and offsets[te][1] >= end_char):
                s = e = 0
            else:
                while ts < len(offsets) and offsets[ts][0] <= start_char:
                    ts += 1
                while offsets[te][1] >= end_char:
                    te -= 1
                s, e = ts - 1, te + 1
            feats.append({"input_ids": enc["input_ids"][i], "token_type_ids": enc["token_type_ids"][i],
                          "attention_mask": enc["attention_mask"][i], "start_positions": s, "end_positions": e})
        return feats

    def eval_features(examples):
        enc = tok([e.question.lstrip() for e in examples], [e.context for e in examples], **kw)
        feats, meta = [], []
        for i, offsets in enumerate(enc["offset_mapping"]):
            seq = enc.sequence_ids(i)
            feats.append({"input_ids": enc["input_ids"][i], "token_type_ids": enc["token_type_ids"][i], "attention_mask": enc["attention_mask"][i]})
            meta.append((enc["overflow_to_sample_mapping"][i], [o if seq[k] == 1 else None for k, o in enumerate(offsets)]))
        return feats, meta

    train_feats = train_features(train)
    dev_feats, dev_meta = eval_features(dev)
    with tempfile.TemporaryDirectory() as out:
        trainer = Trainer(model=model, args=_hf_args(out, hp), train_dataset=train_feats, data_collator=default_data_collator)
        trainer.train()
        start_logits, end_logits = trainer.predict(dev_feats).predictions
    # utils_qa.postprocess_qa_predictions: n-best 20 starts x ends per feature, max length 30.
    by_example = collections.defaultdict(list)
    for f, (ex_idx, _) in enumerate(dev_meta):
        by_example[ex_idx].append(f)
    answers = {}
    for ex_idx, ex in enumerate(dev):
        best, best_score = "", -np.inf
        for f in by_example[ex_idx]:
            offsets = dev_meta[f][1]
            for s in np.argsort(start_logits[f])[-1:-21:-1]:
                for e in np.argsort(end_logits[f])[-1:-21:-1]:
                    if s >= len(offsets) or e >= len(offsets) or offsets[s] is None or offsets[e] is None:
                        continue
                    if e < s or e - s + 1 > 30:
                        continue
                    score = start_logits[f][s] + end_logits[f][e]
                    if score > best_score:
                        best_score, best = score, ex.context[offsets[s][0]:offsets[e][1]]
        answers[ex.qid] = best
    _sync()
    wall = time.time() - t0
    return {"score": squad_v1(answers, dev)["f1"], "wall_s": wall}


HF_RUNNERS = {"sst-2": (run_hf_sst2, "glue/SST-2", "accuracy"), "conll2003": (run_hf_conll, "conll2003", "f1"), "squad": (run_hf_squad, "squad_v1.1", "f1")}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default=str(REPO.parent / "shared" / "data"))
    parser.add_argument("--model", required=True, help="HF-format folder of all-MiniLM-L6-v2 (both sides load it)")
    parser.add_argument("--tasks", nargs="*", default=list(HYPER))
    parser.add_argument("--fast", default="auto", help="ctxkit fast plans, comma-separated (default: auto)")
    parser.add_argument("--no-peer", action="store_true", help="time ctxkit only")
    parser.add_argument("--results", default=None)
    parser.add_argument("--limit", type=int, default=0, help="smoke test: first N examples per split (records not written)")
    args = parser.parse_args(argv)
    global LIMIT
    LIMIT = args.limit
    if not torch.cuda.is_available() and not LIMIT:
        print("this benchmark needs a GPU (bf16 fine-tuning on both sides); --limit N runs a CPU smoke test", file=sys.stderr)
        return 2
    import transformers

    device = device_name()
    script = command_line("finetune_vs_hf.py", argv if argv is not None else sys.argv[1:])
    records = []
    for name in args.tasks:
        runner, sub, metric = HF_RUNNERS[name]
        hp = HYPER[name]
        data = Path(args.data) / sub
        peer = None if args.no_peer else runner(args.model, data, hp)
        if peer:
            print(f"{name}: transformers {metric} {peer['score']:.2f} in {peer['wall_s']:.1f}s", flush=True)
        for plan in args.fast.split(","):
            ours = run_ctxkit(name, args.model, data, hp, fast=plan)
            print(f"{name} --fast {plan} ({ours['fast']}): ctxkit {metric} {ours['score']:.2f} in {ours['wall_s']:.1f}s", flush=True)
            split = "qa-eval" if name == "squad" else "dev"
            extra = (["--max-seq-len", str(hp["max_length"]), "--doc-stride", str(hp["stride"])] if name == "squad"
                     else ["--max-length", str(hp["max_length"])])
            command = " ".join(["ctxkit finetune", name, "--model MODEL --data", f"DATA/{sub}", "--out RUN --epochs", str(hp["epochs"]),
                                "--batch-size", str(hp["batch_size"]), "--lr", f"{hp['lr']:g}", *extra, "--fast", plan])
            peer_name = f"transformers {transformers.__version__} Trainer"
            records.append(speed_record("finetune_vs_hf", f"{name} ({hp['epochs']} ep, bs {hp['batch_size']}, lr {hp['lr']:g}, bf16), "
                                        f"--fast {plan}", "wall time to dev score", "s", ours["wall_s"], peer_name if peer else None,
                                        peer["wall_s"] if peer else None, command, lower_is_better=True, device=device,
                                        ctxkit_plan=ours["fast"], hyper=hp, benchmark_command=script))
            records.append({"task": name, "split": split, "metric": metric, "value": round(ours["score"], 2),
                            "model": "bert_6_384_12 / all_minilm_l6_v2", "peer_name": f"{peer_name}, same hyper-parameters" if peer else None,
                            "peer_value": round(peer["score"], 2) if peer else None, "device": device, "date": today(),
                            "command": command, "fast": plan, "hyper": hp})
            print(f"{name} --fast {plan}: ctxkit {ours['wall_s']:.1f}s" + (f", HF {peer['wall_s']:.1f}s, "
                  f"{peer['wall_s'] / ours['wall_s']:.2f}x" if peer else ""), flush=True)
    if not LIMIT:
        write_records("finetune_vs_hf.json", records, args.results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
