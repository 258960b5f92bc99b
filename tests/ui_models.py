"""Tiny local models for the tests of ``ctxkit ui`` (tests/test_ui.py, tests/test_ui_browser.py):
an encoder with its masked-LM head, a question-answering and an NER checkpoint (transformers'
task layouts), and a GPT-2, each a folder as a user names it on the command line. Random
weights, written by ctxkit's own savers: no transformers import (seconds on a busy 2-core
machine), heads scaled so that they separate their inputs."""

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from ctxkit.models.bert.model import BertConfig, BertModel, save_bert
from ctxkit.models.bert.mlm import BertForMaskedLM, save_bert_masked_lm
from ctxkit.models.gpt2.model import GPT2Config, GPT2LMHeadModel, save_gpt2
from ctxkit.tokenizers import ByteLevelBPETokenizer, WordPieceTokenizer

WORDS = ("the a film great bad fine plot actor was is it in at on of to and paris john lives works berlin where does who "
         "river bank money sat deposited raised its rates water check loan , . ?").split()
TAGS = {0: "O", 1: "B-PER", 2: "I-PER", 3: "B-LOC", 4: "I-LOC"}
NER_TEXT = "john lives in paris and the actor works in berlin"  # the random tagger finds entities here
QA = ("who lives in paris ?", "john lives in paris , the actor works in berlin")


def _config(vocab: int) -> BertConfig:
    return BertConfig(num_layers=2, hidden_size=32, num_heads=2, ffn_size=48, vocab_size=vocab, max_position=64)


def _tokenizer(folder: Path) -> WordPieceTokenizer:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + list(WORDS)) + "\n")
    return WordPieceTokenizer.from_dir(folder)


def _task_checkpoint(folder: Path, architecture: str, head: dict, **config) -> Path:
    """A transformers ``Bert<architecture>`` folder: the encoder's weights under ``bert.``,
    the head's under its own names."""
    tokenizer = _tokenizer(folder)
    torch.manual_seed(0)
    save_bert(BertModel(_config(tokenizer.vocab_size)), folder, tokenizer)
    state = {"bert." + k: v for k, v in load_file(str(folder / "model.safetensors")).items()}
    save_file({**state, **head}, str(folder / "model.safetensors"))
    hf = json.loads((folder / "config.json").read_text())
    hf.update(architectures=[architecture], **config)
    (folder / "config.json").write_text(json.dumps(hf, indent=2))
    return folder


def tiny_encoder(folder: Path) -> Path:
    """A 2-layer ``BertForMaskedLM`` whose head ranks the fillers (at init its logits are flat)."""
    tokenizer = _tokenizer(folder)
    torch.manual_seed(0)
    model = BertForMaskedLM(_config(tokenizer.vocab_size))
    with torch.no_grad():
        for name, p in model.mlm.named_parameters():
            p.normal_(0.0, 2.0 if name.endswith("bias") else 1.0)
    return save_bert_masked_lm(model, folder, tokenizer)


def tiny_gpt2(folder: Path) -> Path:
    """A 2-layer GPT-2 folder with a byte-level BPE (every id decodes to text)."""
    corpus = ["the river bank was green and the money bank was closed", "john lives in paris and works in berlin"] * 20
    tokenizer = ByteLevelBPETokenizer.train(iter(corpus), vocab_size=300, min_frequency=1, show_progress=False)
    torch.manual_seed(0)
    config = GPT2Config(num_layers=2, hidden_size=32, num_heads=2, ffn_size=128, vocab_size=tokenizer.vocab_size, max_position=128)
    save_gpt2(GPT2LMHeadModel(config), folder)
    tokenizer.save(folder)
    return folder


def tiny_ui_folders(tmp_path: Path) -> dict:
    """role -> folder: ``encoder`` (BertForMaskedLM), ``qa``, ``ner``, ``generator`` (GPT-2)."""
    torch.manual_seed(1)
    qa_head = {"qa_outputs.weight": torch.randn(2, 32) * 3, "qa_outputs.bias": torch.zeros(2)}
    ner_head = {"classifier.weight": torch.randn(len(TAGS), 32) * 3, "classifier.bias": torch.zeros(len(TAGS))}
    return {
        "encoder": tiny_encoder(tmp_path / "mlm"),
        "qa": _task_checkpoint(tmp_path / "qa", "BertForQuestionAnswering", qa_head),
        "ner": _task_checkpoint(tmp_path / "ner", "BertForTokenClassification", ner_head,
                                id2label={str(k): v for k, v in TAGS.items()}, label2id={v: k for k, v in TAGS.items()}),
        "generator": tiny_gpt2(tmp_path / "gpt"),
    }
