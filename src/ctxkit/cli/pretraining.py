"""``ctxkit pretrain-data | pretrain-vocab``: pretraining data verbs of the command line.

Imports inside the handlers are on purpose: a verb loads its machinery (models, training,
tasks) only when it runs, so parsing the command line and every other verb stay light.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import math
from pathlib import Path

from ..core.checkpoint import atomic_write
from ..pretraining.bilm import BiLMTrainConfig, evaluate_final, train_bilm
from ..pretraining.corpus import FORMATS
from ..pretraining.distill import distill_pretrain
from ..pretraining.xl_lm import XLTrainConfig, _write_text, evaluate_xl_lm, load_xl_lm, train_xl_lm, xl_stream
from ..pretraining.xlnet_pretrain import pretrain_xlnet
from ..core.errors import UserError
from ..zoo.families import load_model
from ..zoo.presets import ELMO_PRESETS, TRANSFO_XL_PRESETS, XLNET_PRESETS
from ..training.callbacks import add_log_to_argument, make_callbacks
from .char_lm import add_char_flags, run_char_lm
from .models import add_wordpiece_flags, check_vocab_size
from .train_flags import (device_option, add_allow_changes_argument, add_on_sigterm_argument, add_train_flags, signal_status,
                          train_config_from_args)
from ..data.errors import check_input, require_rereadable
from ..pretraining.corpus import write_word_corpus
from ..pretraining.lm import corpus_ids, perplexity, train_lm
from ..pretraining.masking import MaskingConfig
from ..pretraining.shards import build_shards, train_vocab
from ..pretraining.train import default_pretrain_lr, pretrain
from ..tokenizers import ByteLevelBPETokenizer, read_lines
from ..zoo import checkpoint_folder

__all__ = ["add_commands"]


def _tokenizer_dir(name: str) -> Path:
    """A tokenizer folder, or the folder of a checkpoint (``all_minilm_l6_v2``, a Hub id such as
    ``bert-base-uncased``). Only the vocabulary is needed: the weights are not hashed."""
    return checkpoint_folder(name, verify=False)


def _check_inputs(files) -> None:
    for f in files:
        check_input(f)  # a file, a FIFO or <(...)


def cmd_pretrain_data(args: argparse.Namespace) -> int:
    """Handler of ``pretrain-data``; prints a JSON summary and returns 0."""

    _check_inputs(args.corpus)
    if args.limit_docs is not None and args.limit_docs < 1:
        raise UserError(f"--limit-docs must be >= 1, got {args.limit_docs}")
    meta = build_shards(
        args.corpus, _tokenizer_dir(args.tokenizer), args.out, max_seq_len=args.max_seq_len,
        short_seq_prob=args.short_seq_prob, nsp_prob=args.nsp_prob, dupe_factor=args.dupe_factor, seed=args.seed,
        workers=args.workers, docs_per_shard=args.docs_per_shard, format=args.format, limit_docs=args.limit_docs,
        show_progress=not args.no_progress,
    )
    summary = {k: meta[k] for k in ("num_documents", "num_instances", "num_tokens", "num_random_next")}
    summary.update(shards=len(meta["shards"]), out=str(args.out))
    print(json.dumps(summary, indent=2))
    return 0


def cmd_pretrain_vocab(args: argparse.Namespace) -> int:
    """Handler of ``pretrain-vocab``; returns 0."""
    _check_inputs(args.corpus)
    check_vocab_size(args.vocab_size)
    tok = train_vocab(args.corpus, args.vocab_size, args.out, format=args.format, min_frequency=args.min_frequency,
                      lowercase=not args.cased, limit_docs=args.limit_docs, show_progress=not args.no_progress)
    print(f"wrote a WordPiece vocabulary of {tok.vocab_size} tokens to {args.out}")
    return 0


def cmd_lm_corpus(args: argparse.Namespace) -> int:
    """Handler of ``lm-corpus``; prints a JSON summary and returns 0."""

    _check_inputs(args.corpus)
    print(json.dumps(write_word_corpus(args.corpus, args.out, args.format, args.lower, not args.no_progress), indent=2))
    return 0


def add_commands(sub: argparse._SubParsersAction) -> None:
    """Register ``pretrain-data``, ``pretrain-vocab`` and ``lm-corpus`` on the ``ctxkit`` parser."""
    fmt_help = "corpus format: auto (WikiExtractor if the file starts with '<doc ', else blank), blank, file, wikiextractor"
    p = sub.add_parser("pretrain-data", help="raw text -> MLM/NSP pretraining shards (.npy + meta.json)",
                       description="Split documents into sentences, tokenize, build BERT sentence pairs and write shards.")
    p.add_argument("corpus", nargs="+", metavar="CORPUS", help="text files (plain or .xz)")
    p.add_argument("--tokenizer", required=True, metavar="DIR_OR_CHECKPOINT",
                   help="tokenizer folder or checkpoint name (all_minilm_l6_v2, a Hub id such as bert-base-uncased)")
    p.add_argument("--out", required=True, metavar="DIR", help="output folder for shard_*.npy and meta.json")
    p.add_argument("--max-seq-len", type=int, default=128, help="tokens per instance incl. [CLS]/[SEP] (default: 128; BERT's phase 2 uses 512)")
    p.add_argument("--short-seq-prob", type=float, default=0.1, help="share of shorter random-length instances (default: 0.1)")
    p.add_argument("--nsp-prob", type=float, default=0.5, help="probability that segment B is random (default: 0.5)")
    p.add_argument("--dupe-factor", type=int, default=1, help="passes over the corpus with different pairs (default: 1)")
    p.add_argument("--workers", type=int, default=None, help="processes (default: all cores; 1 = no pool)")
    p.add_argument("--docs-per-shard", type=int, default=2000, help="documents per shard and random-next pool (default: 2000)")
    p.add_argument("--seed", type=int, default=0, help="random seed (default: 0)")
    p.add_argument("--format", choices=FORMATS, default="auto", help=fmt_help)
    p.add_argument("--limit-docs", type=int, default=None, metavar="N", help="use only the first N documents")
    p.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    p.set_defaults(func=cmd_pretrain_data)

    p = sub.add_parser("pretrain-vocab", help="train a WordPiece vocabulary on a pretraining corpus",
                       description="Train a WordPiece vocabulary on corpus documents (WikiExtractor markup removed).")
    p.add_argument("corpus", nargs="+", metavar="CORPUS", help="text files (plain or .xz)")
    add_wordpiece_flags(p)
    p.add_argument("--format", choices=FORMATS, default="auto", help=fmt_help)
    p.add_argument("--limit-docs", type=int, default=None, metavar="N", help="use only the first N documents")
    p.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    p.set_defaults(func=cmd_pretrain_vocab)

    p = sub.add_parser("lm-corpus", help="raw documents -> one tokenised sentence per line (for word-level LMs)",
                       description="Split documents into sentences and words (punctuation split off) for pretrain-elmo, "
                                   "train-transformer-xl and word2vec-train; a blank line between documents.")
    p.add_argument("corpus", nargs="+", metavar="CORPUS", help="text files (plain or .xz)")
    p.add_argument("--out", required=True, metavar="FILE", help="output text file (.xz: compressed)")
    p.add_argument("--lower", action="store_true", help="lowercase the words")
    p.add_argument("--format", choices=FORMATS, default="auto", help=fmt_help)
    p.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    p.set_defaults(func=cmd_lm_corpus)


def cmd_pretrain(args: argparse.Namespace) -> int:
    """Handler of ``pretrain``; prints a JSON summary and returns 0."""
    logging.getLogger("ctxkit").setLevel(logging.INFO)
    callbacks = make_callbacks(args.log_to, args.out)  # a missing extra fails before the shards are read
    if args.lr is None:  # the preset's: 1e-3 diverges on BERT-base
        args.lr = default_pretrain_lr(args.preset)
    config = train_config_from_args(args, eval_each_epoch=args.eval_data is not None)
    masking = MaskingConfig(whole_word=args.whole_word, max_predictions=args.max_predictions)
    summary = pretrain(args.data, args.preset, args.out, config, args.tokenizer and _tokenizer_dir(args.tokenizer), masking, args.resume,
                       callbacks=callbacks, eval_data=args.eval_data)
    print(json.dumps(summary, indent=2))
    return signal_status(summary, args.out, args.on_sigterm)


def add_pretrain_command(sub: argparse._SubParsersAction) -> None:
    """Register ``pretrain`` (MLM + NSP from scratch on pretrain-data shards)."""
    p = sub.add_parser("pretrain", help="pretrain BERT (MLM + NSP) from scratch on pretrain-data shards",
                       description="Masked LM + next-sentence prediction with dynamic masking; writes RUN_DIR/final in the HF layout.")
    p.add_argument("--data", required=True, metavar="SHARDS", help="folder written by pretrain-data")
    p.add_argument("--preset", default="bert_4_256_4", help="architecture (default: bert_4_256_4)")
    p.add_argument("--out", required=True, metavar="RUN_DIR")
    p.add_argument("--tokenizer", default=None, help="tokenizer folder or checkpoint name (default: the one in the shards' meta.json)")
    p.add_argument("--eval-data", default=None, metavar="SHARDS",
                   help="held-out shards (pretrain-data, same tokenizer): MLM loss/accuracy and NSP accuracy after every epoch")
    add_train_flags(p, "pretrain")  # epochs, lr, optimizer, schedule, ... (cli/train_flags.py)
    lr = next(action for action in p._actions if action.dest == "lr")
    lr.help = "peak learning rate (default: 1e-4 for presets 768 wide or wider, as BERT; 1e-3 below)"
    p.add_argument("--whole-word", action="store_true", help="whole-word masking")
    p.add_argument("--max-predictions", type=int, default=20, help="masked positions per sequence at most (BERT: 20 at seq 128)")
    p.add_argument("--resume", action="store_true", help="continue from RUN_DIR/checkpoint exactly")
    add_allow_changes_argument(p)
    add_on_sigterm_argument(p)
    add_log_to_argument(p)
    p.set_defaults(func=cmd_pretrain)

    p = sub.add_parser("distill-pretrain", help="task-agnostic distillation (DistilBERT) of a BERT checkpoint on pretrain-data shards",
                       description="A student keeping every other teacher layer trains on DistilBERT's triple loss (soft MLM "
                                   "targets at temperature T, MLM, cosine of the last hidden states) over dynamically masked "
                                   "shards; a teacher without a masked-LM head gets it fitted first with its body frozen. "
                                   "Writes RUN_DIR/final in the HF layout (ctxkit finetune --model takes it).")
    p.add_argument("--data", required=True, metavar="SHARDS", help="folder written by pretrain-data with the teacher's vocabulary")
    p.add_argument("--teacher", required=True, help="a BERT-family checkpoint: name, Hub id or folder")
    p.add_argument("--out", required=True, metavar="RUN_DIR")
    p.add_argument("--student-layers", dest="student_layers", type=int, default=3, help="layers kept (default: 3)")
    p.add_argument("--temperature", type=float, default=2.0, help="T of the soft targets (default: 2)")
    p.add_argument("--alpha-ce", dest="alpha_ce", type=float, default=5.0, help="weight of the soft loss (default: 5)")
    p.add_argument("--alpha-mlm", dest="alpha_mlm", type=float, default=2.0, help="weight of the MLM loss (default: 2)")
    p.add_argument("--alpha-cos", dest="alpha_cos", type=float, default=1.0, help="weight of the cosine loss (default: 1)")
    p.add_argument("--head-steps", dest="head_steps", type=int, default=500,
                   help="steps to fit a missing masked-LM head with the teacher's body frozen (default: 500)")
    add_train_flags(p, "pretrain")
    p.add_argument("--max-predictions", type=int, default=20, help="masked positions per sequence at most")
    p.add_argument("--resume", action="store_true", help="continue from RUN_DIR/checkpoint exactly")
    add_allow_changes_argument(p)
    add_on_sigterm_argument(p)
    add_log_to_argument(p)
    p.set_defaults(func=cmd_distill_pretrain)


def cmd_distill_pretrain(args: argparse.Namespace) -> int:
    """Handler of ``distill-pretrain``; prints a JSON summary and returns 0."""
    logging.getLogger("ctxkit").setLevel(logging.INFO)
    callbacks = make_callbacks(args.log_to, args.out)
    summary = distill_pretrain(args.data, args.teacher, args.out, train_config_from_args(args, eval_each_epoch=False),
                               student_layers=args.student_layers, temperature=args.temperature, alpha_ce=args.alpha_ce,
                               alpha_mlm=args.alpha_mlm, alpha_cos=args.alpha_cos, head_steps=args.head_steps,
                               masking=MaskingConfig(max_predictions=args.max_predictions), resume=args.resume, callbacks=callbacks)
    print(json.dumps(summary, indent=2))
    return signal_status(summary, args.out, args.on_sigterm)


def cmd_lm_train(args: argparse.Namespace) -> int:
    """Handler of ``lm-train``; prints a JSON summary."""
    if args.char or (args.preset or "").startswith("char_"):
        return run_char_lm(args)
    logging.getLogger("ctxkit").setLevel(logging.INFO)
    callbacks = make_callbacks(args.log_to, args.out, eval_name="valid")
    config = train_config_from_args(args)
    summary = train_lm(args.train, args.valid, args.preset or "gpt2_4_256_4", args.out, config, tokenizer_dir=args.tokenizer,
                       vocab_size=args.vocab_size, block_size=args.block_size, eval_stride=args.stride, callbacks=callbacks)
    print(json.dumps(summary, indent=2))
    return signal_status(summary, args.out, args.on_sigterm, resumable=False)


def cmd_perplexity(args: argparse.Namespace) -> int:
    """Handler of ``perplexity``; prints a JSON line."""

    for path in args.data:  # read twice below: tokens, then words
        require_rereadable(path, "perplexity")
    folder = checkpoint_folder(args.model)  # a folder, a run folder (its best/), a checkpoint name or a Hub id
    model, _ = load_model(folder, family="gpt2")
    ids = corpus_ids(args.data, ByteLevelBPETokenizer.from_dir(folder), show_progress=not args.no_progress)
    result = perplexity(model, ids, args.max_length, args.stride, device=args.device, batch_size=args.batch_size,
                        show_progress=not args.no_progress)
    # Word-level perplexity (the WikiText/PTB convention: words plus one end-of-line per
    # line) does not depend on the tokenizer, so models with different vocabularies compare.
    words = sum(len(line.split()) + 1 for path in args.data for line in read_lines(path))
    result["words"] = words
    result["word_perplexity"] = math.exp(result["nll"] * result["tokens"] / words)
    print(json.dumps({"model": str(args.model), "data": [str(d) for d in args.data], **result}))
    return 0


def add_lm_commands(sub: argparse._SubParsersAction) -> None:
    """Register ``lm-train`` and ``perplexity`` (GPT-2 language models)."""
    p = sub.add_parser("lm-train", help="train a small GPT-2 (or, with --char, a character LM) from scratch on text files",
                       description="Byte-level BPE (trained on the corpus unless --tokenizer), fixed-length blocks, next-token loss; "
                                   "RUN_DIR/best is an HF-format GPT-2 folder with its tokenizer. With --char: a character "
                                   "Transformer with Al-Rfou et al.'s auxiliary losses (or a character LSTM), bits per character.")
    p.add_argument("--train", nargs="+", required=True, metavar="FILE", help="training text (plain or .xz)")
    p.add_argument("--valid", nargs="+", required=True, metavar="FILE", help="validation text for perplexity")
    p.add_argument("--preset", default=None, help="GPT-2 architecture (default: gpt2_4_256_4), or a char_* preset")
    p.add_argument("--out", required=True, metavar="RUN_DIR")
    p.add_argument("--tokenizer", default=None, metavar="DIR", help="existing vocab.json + merges.txt folder")
    p.add_argument("--vocab-size", type=int, default=8000, help="BPE vocabulary to train (default: 8000)")
    p.add_argument("--block-size", type=int, default=128, help="training length = context length (default: 128)")
    p.add_argument("--stride", type=int, default=None, help="perplexity window step (default: block size / 2)")
    add_train_flags(p, "lm-train")  # epochs, lr, ... (cli/train_flags.py)
    add_on_sigterm_argument(p)
    add_log_to_argument(p)
    add_char_flags(p)
    p.set_defaults(func=cmd_lm_train)

    p = sub.add_parser("perplexity", help="sliding-window perplexity of a GPT-2 folder on text files",
                       description="Score a token stream with windows of --max-length tokens advancing by --stride.")
    p.add_argument("model", metavar="MODEL_DIR", help="HF-format GPT-2 folder with vocab.json and merges.txt")
    p.add_argument("data", nargs="+", metavar="FILE", help="text files (plain or .xz)")
    p.add_argument("--max-length", type=int, default=None, help="window length (default: the model's context)")
    p.add_argument("--stride", type=int, default=None, help="window step (default: half the window)")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--device", type=device_option, default="auto")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=cmd_perplexity)


def _cmd_elmo(args: argparse.Namespace) -> int:
    """Handler of ``ctxkit pretrain-elmo``."""
    callbacks = make_callbacks(args.log_to, args.out, eval_name="valid")  # a missing extra fails before the corpus is read
    # Progress lines through main()'s handler, one each (a root handler of basicConfig printed each twice).
    logging.getLogger("ctxkit").setLevel(logging.INFO)
    arch = ELMO_PRESETS[args.preset]
    overrides = {k: getattr(args, k) for k in ("cell_size", "projection_dim", "n_highway", "num_layers", "dropout")
                 if getattr(args, k) is not None}
    if args.filters:
        overrides["filters"] = tuple(tuple(f) for f in json.loads(args.filters))
    arch = arch.replace(**overrides)
    fields = {f.name for f in dataclasses.fields(BiLMTrainConfig)}
    cfg = BiLMTrainConfig(**{k: v for k, v in vars(args).items() if k in fields}, progress=not args.no_progress)
    summary = train_bilm(args.train, args.valid, args.out, arch, cfg, resume=args.resume, callbacks=callbacks)
    if args.test and "stopped" not in summary:  # a signal stop has no final/ to test
        summary["test"] = evaluate_final(args.out, args.test, cfg.device, cfg.precision, arch.max_chars)
        results = Path(args.out) / "results.json"
        saved = json.loads(results.read_text(encoding="utf-8"))
        saved["test"] = summary["test"]
        atomic_write(results, lambda tmp: Path(tmp).write_text(json.dumps(saved, indent=2) + "\n", encoding="utf-8"))
    keys = ("steps", "epoch", "valid", "test", "tokens_per_s", "train_time_s", "parameters", "stopped")
    print(json.dumps({k: summary[k] for k in keys if k in summary}, indent=2))
    return signal_status(summary, args.out, args.on_sigterm)


def _add_elmo(sub: argparse._SubParsersAction) -> None:
    d = BiLMTrainConfig()
    p = sub.add_parser('pretrain-elmo', help='pretrain an ELMo biLM (char CNN + biLSTM) on text files',
                       description='`ctxkit pretrain-elmo` (or `python -m ctxkit.pretraining.bilm`): train an ELMo biLM from text files.')
    p.add_argument("--train", nargs="+", required=True, help="whitespace-tokenised training files (.xz ok)")
    p.add_argument("--valid", nargs="*", default=[], help="validation files")
    p.add_argument("--out", required=True, help="run folder")
    p.add_argument("--preset", default="elmo_2x1024_128_2048cnn_1xhighway", choices=sorted(ELMO_PRESETS))
    p.add_argument("--filters", help='override the char-CNN filters, JSON, e.g. "[[1,32],[2,64],[3,128]]"')
    for name in ("cell_size", "projection_dim", "n_highway", "num_layers"):
        p.add_argument("--" + name.replace("_", "-"), type=int, help=f"override the preset's {name}")
    p.add_argument("--dropout", type=float, help="override the preset's dropout (0.1)")
    for field in ("batch_size", "unroll", "epochs", "max_steps", "warmup_steps", "num_samples", "eval_batch_size", "eval_unroll", "save_every",
                  "log_every", "min_count", "max_vocab", "seed"):
        p.add_argument("--" + field.replace("_", "-"), type=int, default=getattr(d, field))
    for field in ("max_time_s", "lr", "clip_norm", "state_reset_prob"):
        p.add_argument("--" + field.replace("_", "-"), type=float, default=getattr(d, field))
    p.add_argument("--optimizer", default=d.optimizer, choices=["adam", "adagrad"])
    p.add_argument("--softmax", default=d.softmax, choices=["sampled", "full", "adaptive"])
    p.add_argument("--device", type=device_option, default=d.device)
    p.add_argument("--precision", default=d.precision, choices=["auto", "bf16", "fp32"])
    p.add_argument("--compile", action="store_true", help="torch.compile the LSTM time step (GPU)")
    p.add_argument("--resume", action="store_true", help="continue from OUT/checkpoint/ (or the OUT/checkpoint.pt of earlier versions)")
    add_allow_changes_argument(p)
    add_on_sigterm_argument(p)
    p.add_argument("--test", nargs="*", default=[], help="test files: exact-softmax perplexity of the final model "
                                                          "(forward, backward, average) added to results.json")
    p.add_argument("--no-progress", action="store_true")
    add_log_to_argument(p)
    p.set_defaults(func=_cmd_elmo)


def _cmd_xlnet(args: argparse.Namespace) -> int:
    """Handler of ``ctxkit pretrain-xlnet``."""
    callbacks = make_callbacks(args.log_to, args.out)  # a missing extra fails before the data is read
    overrides = {k: v for k, v in (("d_model", args.d_model), ("n_layers", args.n_layers), ("n_heads", args.n_heads),
                                   ("d_inner", args.d_inner), ("dropout", args.dropout)) if v is not None}
    arch = XLNET_PRESETS[args.preset].replace(**overrides)
    config = train_config_from_args(args, eval_each_epoch=False)
    summary = pretrain_xlnet(args.data, arch, args.out, config, K=args.K, resume=args.resume, callbacks=callbacks)
    print(json.dumps(summary, indent=2))
    return signal_status(summary, args.out, args.on_sigterm)


def _add_xlnet(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser('pretrain-xlnet', help='pretrain XLNet (permutation LM, partial prediction) on `ctxkit pretrain-data` shards',
                       description="XLNet permutation-LM pretraining on pretrain-data shards")
    p.add_argument("--data", required=True, metavar="SHARDS", help="folder written by ctxkit pretrain-data")
    p.add_argument("--preset", default="xlnet_12_768_12", choices=sorted(XLNET_PRESETS))
    p.add_argument("--d-model", type=int, default=None, help="override the preset's width")
    p.add_argument("--n-layers", type=int, default=None, help="override the preset's depth")
    p.add_argument("--n-heads", type=int, default=None, help="override the preset's heads")
    p.add_argument("--d-inner", type=int, default=None, help="override the preset's FFN size")
    p.add_argument("--dropout", type=float, default=None, help="override the preset's dropout")
    p.add_argument("--out", required=True, metavar="RUN_DIR")
    p.add_argument("--K", type=float, default=6.0, help="predict about 1/K of the tokens (default: 6)")
    add_train_flags(p, "pretrain-xlnet")  # epochs, lr, ... (cli/train_flags.py)
    p.add_argument("--resume", action="store_true", help="continue from RUN_DIR/checkpoint exactly")
    add_allow_changes_argument(p)
    add_on_sigterm_argument(p)
    add_log_to_argument(p)
    p.set_defaults(func=_cmd_xlnet)


def _cmd_transformer_xl(args: argparse.Namespace) -> int:
    """Handler of ``ctxkit train-transformer-xl``."""
    callbacks = make_callbacks(args.log_to, args.out, eval_name="valid")  # a missing extra fails before the corpus is read
    # Progress lines through main()'s handler, one each (a root handler of basicConfig printed each twice).
    logging.getLogger("ctxkit").setLevel(logging.INFO)
    overrides = {k: getattr(args, k) for k in _XL_ARCH_FIELDS if getattr(args, k) is not None}
    if args.cutoffs is not None:
        overrides["cutoffs"] = tuple(args.cutoffs)
    arch = TRANSFO_XL_PRESETS[args.preset].replace(**overrides)
    fields = {f.name for f in dataclasses.fields(XLTrainConfig)}
    cfg = XLTrainConfig(**{k: v for k, v in vars(args).items() if k in fields}, progress=not args.no_progress)
    summary = train_xl_lm(args.train, args.valid, args.out, arch, cfg, resume=args.resume, callbacks=callbacks)
    summary["preset"] = args.preset
    if args.test and "stopped" not in summary:  # a signal stop has no final/ to test
        model, vocab = load_xl_lm(Path(args.out) / "final")
        stream = xl_stream(args.test, vocab)
        mem_lens = [0] if args.model == "vanilla" else (
            args.eval_mem_lens if args.eval_mem_lens is not None else sorted({0, cfg.mem_len, 2 * cfg.tgt_len, 4 * cfg.tgt_len}))
        summary["test"] = {}
        for m in mem_lens:
            r = evaluate_xl_lm(model, stream, cfg.tgt_len, m, args.eval_clamp_len, cfg.eval_batch_size, cfg.device, cfg.precision)
            summary["test"][f"mem_len={m}"] = r
            logging.getLogger("ctxkit").info("test mem_len %d: perplexity %.2f, %.0f tokens/s", m, r["perplexity"], r["tokens_per_s"])
        _write_text(Path(args.out) / "results.json",
                    json.dumps({k: v for k, v in summary.items() if k != "losses"}, indent=2) + "\n")
    keys = ("model", "steps", "epoch", "parameters", "train_tokens_per_s", "train_time_s", "valid", "test", "stopped")
    print(json.dumps({k: summary[k] for k in keys if k in summary}, indent=2))
    return signal_status(summary, args.out, args.on_sigterm)


# Architecture fields of a Transformer-XL preset that train-transformer-xl can override.
_XL_ARCH_FIELDS = {"d_model": int, "n_heads": int, "d_inner": int, "n_layers": int, "div_val": int, "dropout": float,
                   "dropatt": float}


def _add_transformer_xl(sub: argparse._SubParsersAction) -> None:
    d = XLTrainConfig()
    p = sub.add_parser('train-transformer-xl', help='train a Transformer-XL (or a vanilla Transformer) word-level LM; test perplexity at several memory lengths',
                       description='Train a word-level Transformer-XL (or vanilla Transformer) LM, then score test files at several memory lengths.')
    p.add_argument("--train", nargs="+", required=True, help="whitespace-tokenised training files (.xz ok)")
    p.add_argument("--valid", nargs="*", default=[])
    p.add_argument("--test", nargs="*", default=[])
    p.add_argument("--out", required=True, help="run folder")
    p.add_argument("--preset", default="transfo_xl_wt2_small", choices=sorted(TRANSFO_XL_PRESETS))
    for name, kind in _XL_ARCH_FIELDS.items():
        p.add_argument("--" + name.replace("_", "-"), type=kind, help=f"override the preset's {name}")
    p.add_argument("--cutoffs", type=int, nargs="*", help="override the adaptive cutoffs (none: full softmax)")
    p.add_argument("--model", default=d.model, choices=["xl", "vanilla"])
    for name in ("batch_size", "tgt_len", "mem_len", "max_steps", "warmup_steps", "eval_every", "eval_batch_size", "save_every",
                 "stop_step", "log_every", "seed", "max_vocab", "max_time_s", "lr", "min_lr_ratio", "clip_norm"):
        kind = float if name in ("max_time_s", "lr", "min_lr_ratio", "clip_norm") else int
        p.add_argument("--" + name.replace("_", "-"), type=kind, default=getattr(d, name))
    p.add_argument("--eval-mem-lens", type=int, nargs="*", default=None,
                   help="test memory lengths for the XL (default: 0, the training mem_len, 2x and 4x tgt_len)")
    p.add_argument("--eval-clamp-len", type=int, default=None, help="clamp_len at test time (default: the model's)")
    p.add_argument("--device", type=device_option, default=d.device)
    p.add_argument("--precision", default=d.precision, choices=["auto", "bf16", "fp32"])
    p.add_argument("--resume", action="store_true", help="continue from OUT/checkpoint/ (or the OUT/checkpoint.pt of earlier versions)")
    add_allow_changes_argument(p)
    add_on_sigterm_argument(p)
    p.add_argument("--no-progress", action="store_true")
    add_log_to_argument(p)
    p.set_defaults(func=_cmd_transformer_xl)


def add_elmo_xl_xlnet_commands(sub: argparse._SubParsersAction) -> None:
    """Register pretrain-elmo, pretrain-xlnet and train-transformer-xl."""
    _add_elmo(sub)
    _add_xlnet(sub)
    _add_transformer_xl(sub)
