"""Every model family, in one explicit registry: the one answer to "which family is this?".

A :class:`Family` gathers what the rest of ctxkit needs to know about a family: its config
class, its named presets (each with one line for ``ctxkit list-models``), and how a model is
built, loaded, saved and recognised in a folder. Each family file owns its config class and
its presets; this module only collects them into :data:`FAMILIES` (a plain dict written out
below: nothing registers itself at import time). ``zoo.get_model``, ``zoo.list_models``,
:mod:`ctxkit.zoo.encoders`, ``ctxkit.embed`` (ELMo folders) and the deployment backends
ask :func:`family_of` / :func:`get_family` instead of looking at folders themselves.

Common config names. Where families mean the same thing, every config answers to the same
name, stored or as a read-only property (stored names follow each checkpoint format and
never change):

=================  ===============================================================
``hidden_size``    model width (Transformer-XL / XLNet ``d_model``; ELMo
                   ``output_dim`` = 2 x ``projection_dim``; static vectors ``dim``)
``num_layers``     depth (Transformer-XL / XLNet ``n_layers``; seq2seq has
                   ``num_encoder_layers`` and ``num_decoder_layers`` instead)
``num_heads``      attention heads (Transformer-XL / XLNet ``n_heads``)
``ffn_size``       FFN inner size (Transformer-XL / XLNet ``d_inner``)
``vocab_size``     vocabulary size (stored under this name in every family that has one)
``max_position``   longest input (BERT, GPT-2, seq2seq; relative-position families have none)
=================  ===============================================================

``Family.load(folder)`` returns ``(model, tokenizer)`` for every family; the tokenizer is
None where the folder holds none (or the family has no tokenizer class: ELMo reads
characters, Transformer-XL's HF vocabulary is a pickle that is never loaded, static vectors
are their own vocabulary).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, Mapping, Optional, Tuple, Union

import numpy as np

from ..core.errors import UnknownNameError, UserError
from ..tokenizers import ByteLevelBPETokenizer, WordPieceTokenizer
from ..tokenizers.char import CharTokenizer
from ..models.bert.model import PRESETS as BERT_PRESETS
from ..models.bert.model import BertConfig, BertForPreTraining, BertModel, load_bert, save_bert
from ..models.char_lm.model import (CHAR_DESCRIPTIONS, CHAR_MODEL_TYPES, CHAR_PRESETS, CharLSTMConfig, CharLSTMLM, CharTransformerConfig, CharTransformerLM,
                      build_char_lm, load_char_lm, save_char_lm)
from ..models.common import Preset, check_vocab_fits
from ..models.elmo.model import ELMO_DESCRIPTIONS, ELMO_PRESETS, ElmoBiLM, ElmoConfig, ElmoLanguageModel
from ..models.elmo.io import load_bilm, save_elmo_lm, write_bilm_tf
from ..models.gpt2.model import GPT2_DESCRIPTIONS, GPT2_PRESETS, GPT2Config, GPT2LMHeadModel, GPT2Model, load_gpt2, save_gpt2
from ..models.seq2seq.model import (RNN_SEQ2SEQ_DESCRIPTIONS, RNN_SEQ2SEQ_PRESETS, SEQ2SEQ_DESCRIPTIONS, SEQ2SEQ_PRESETS, RNNSeq2Seq,
                      RNNSeq2SeqConfig, Seq2SeqConfig, TransformerSeq2Seq, load_seq2seq, save_seq2seq)
from ..models.static.vectors import WordVectors
from ..models.static.io import _SUFFIX_FORMATS, _base_suffix, STATIC_DESCRIPTIONS, STATIC_PRESETS, StaticVectorsConfig
from ..models.transformer_xl.model import (TRANSFO_XL_DESCRIPTIONS, TRANSFO_XL_PRESETS, TransformerXLConfig, TransformerXLLMHeadModel,
                             TransformerXLModel)
from ..models.transformer_xl.io import is_ctxkit_transformer_xl, load_transformer_xl, load_transformer_xl_lm, save_transformer_xl_lm
from ..models.xlnet.model import XLNET_DESCRIPTIONS, XLNET_PRESETS, XLNetConfig, XLNetLMHeadModel, XLNetModel, save_xlnet
from ..models.xlnet.encoder import XLNetEncoder

__all__ = ["Family", "FAMILIES", "build_model", "family_of", "find_family", "get_family", "load_model", "preset_family"]

PathLike = Union[str, os.PathLike]


@dataclass(frozen=True)
class Family:
    """One model family.

    Attributes:
        name: registry key (``"bert"``, ``"gpt2"``, ...).
        description: one line: what the family is.
        list_kind: the KIND column of ``ctxkit list-models`` for its presets.
        config_class: the family's config dataclass (defined in the family file).
        presets: name -> :class:`~ctxkit.models.common.Preset` (config + one-line description).
        build: ``build(config) -> model``, randomly initialised.
        load: ``load(folder) -> (model, tokenizer or None)``, the model in eval mode.
        save: ``save(model, folder, tokenizer=None) -> folder``; None where the family has no
            folder format of its own (Transformer-XL reads HF folders only).
        detect: ``detect(folder) -> bool``: the folder holds this family's model. Exclusive:
            at most one family detects a folder.
        model_classes: classes :func:`family_of` recognises a model object by.
    """

    name: str
    description: str
    list_kind: str
    config_class: type
    presets: Mapping[str, Preset]
    build: Callable[[Any], Any]
    load: Callable[[Path], Tuple[Any, Any]]
    save: Optional[Callable[..., Path]]
    detect: Callable[[Path], bool]
    model_classes: Tuple[type, ...] = field(default=())


def _presets(configs: Mapping[str, Any], descriptions: Mapping[str, str]) -> Dict[str, Preset]:
    missing = set(configs) ^ set(descriptions)
    if missing:  # a preset without its line (or a line without its preset) is a bug in the family file
        raise AssertionError(f"presets and descriptions disagree: {sorted(missing)}")
    return {name: Preset(name, config, descriptions[name]) for name, config in configs.items()}


def _model_type(folder: Path) -> Optional[str]:
    """``config.json``'s model_type, "" when it has none, None without a readable config.json."""
    path = folder / "config.json"
    if not path.is_file():
        return None
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return str(config.get("model_type", "")) if isinstance(config, dict) else None


def _has_any(folder: Path, *names: str) -> bool:
    return any((folder / n).is_file() for n in names)


# ---------------------------------------------------------------------------- BERT / DistilBERT


def _bert_family() -> Family:
    def load(folder: Path):
        tok = WordPieceTokenizer.from_dir(folder) if _has_any(folder, "vocab.txt", "tokenizer.json") else None
        model = load_bert(folder)
        check_vocab_fits(model, tok, folder)
        return model, tok

    return Family(
        name="bert", description="BERT and DistilBERT encoders (HF layout, WordPiece)", list_kind="preset",
        config_class=BertConfig, presets=dict(BERT_PRESETS), build=BertModel, load=load, save=save_bert,
        # HF's config.json without a model_type is read as BERT (config_from_hf's default).
        detect=lambda folder: _model_type(folder) in ("bert", "distilbert") or (
            _model_type(folder) == "" and not is_ctxkit_transformer_xl(folder)),
        model_classes=(BertModel, BertForPreTraining))


# ---------------------------------------------------------------------------- GPT-2 and seq2seq: BPE folders


def _with_bpe(load_model: Callable[[Path], Any]) -> Callable[[Path], Tuple[Any, Any]]:
    """A family ``load``: the model, and the byte-level BPE tokenizer when the folder has one."""
    def load(folder: Path):
        tok = ByteLevelBPETokenizer.from_dir(folder) if _has_any(folder, "tokenizer.json", "vocab.json") else None
        model = load_model(folder)
        check_vocab_fits(model, tok, folder)
        return model, tok

    return load


def _saving_tokenizer(save_model: Callable[[Any, PathLike], Path]) -> Callable[..., Path]:
    """A family ``save``: the model's files, then the tokenizer's beside them when one is given."""
    def save(model, folder: PathLike, tokenizer=None) -> Path:
        out = save_model(model, folder)
        if tokenizer is not None:
            tokenizer.save(out)
        return out

    return save


# ---------------------------------------------------------------------------- GPT-2


def _gpt2_family() -> Family:
    return Family(
        name="gpt2", description="GPT-2 decoder-only language models (HF layout, byte-level BPE)", list_kind="preset (GPT-2)",
        config_class=GPT2Config, presets=_presets(GPT2_PRESETS, GPT2_DESCRIPTIONS), build=GPT2LMHeadModel,
        load=_with_bpe(load_gpt2), save=_saving_tokenizer(save_gpt2), detect=lambda folder: _model_type(folder) == "gpt2",
        model_classes=(GPT2LMHeadModel, GPT2Model))


# ---------------------------------------------------------------------------- seq2seq (Transformer, RNN)


def _seq2seq_family() -> Family:
    return Family(
        name="seq2seq", description="Transformer encoder-decoder translators (Vaswani et al. 2017)", list_kind="preset (seq2seq)",
        config_class=Seq2SeqConfig, presets=_presets(SEQ2SEQ_PRESETS, SEQ2SEQ_DESCRIPTIONS), build=TransformerSeq2Seq,
        load=_with_bpe(load_seq2seq), save=_saving_tokenizer(save_seq2seq),
        detect=lambda folder: _model_type(folder) == "ctxkit-seq2seq",
        model_classes=(TransformerSeq2Seq,))


def _rnn_seq2seq_family() -> Family:
    return Family(
        name="rnn_seq2seq", description="RNN encoder-decoder translators with additive attention (Bahdanau et al. 2015)",
        list_kind="preset (seq2seq)", config_class=RNNSeq2SeqConfig,
        presets=_presets(RNN_SEQ2SEQ_PRESETS, RNN_SEQ2SEQ_DESCRIPTIONS), build=RNNSeq2Seq, load=_with_bpe(load_seq2seq),
        save=_saving_tokenizer(save_seq2seq), detect=lambda folder: _model_type(folder) == "ctxkit-rnn-seq2seq",
        model_classes=(RNNSeq2Seq,))


# ---------------------------------------------------------------------------- ELMo


def elmo_detect(folder: Path) -> bool:
    """An ELMo biLM: bilm-tf ``options.json`` (no HF ``config.json``), here or in ``final/``
    (a ``train_bilm`` run folder), or an ``.hdf5`` weight file."""
    folder = Path(folder)
    if folder.is_file():
        return folder.suffix in (".hdf5", ".h5")
    for candidate in (folder, folder / "final"):
        if (candidate / "options.json").is_file() and not (candidate / "config.json").is_file():
            return True
    return False


def _elmo_family() -> Family:
    def load(folder: Path):
        return load_bilm(folder)[0], None

    def save(model, folder: PathLike, tokenizer=None) -> Path:
        """A biLM as bilm-tf ``options.json`` + ``weights.hdf5``; a whole LM with its vocabulary
        (``tokenizer``: the word list) through :func:`~ctxkit.models.elmo.io.save_elmo_lm`."""

        folder = Path(folder)
        if isinstance(model, ElmoLanguageModel):
            if tokenizer is None:
                raise UserError("saving an ELMo language model needs its vocabulary (tokenizer=list of words)")
            return save_elmo_lm(model, folder, tokenizer)
        folder.mkdir(parents=True, exist_ok=True)
        write_bilm_tf(model, folder / "weights.hdf5", folder / "options.json")
        return folder

    return Family(
        name="elmo", description="ELMo character-CNN biLSTM language models (Peters et al. 2018)", list_kind="preset (ELMo)",
        config_class=ElmoConfig, presets=_presets(ELMO_PRESETS, ELMO_DESCRIPTIONS), build=ElmoBiLM, load=load, save=save,
        detect=elmo_detect, model_classes=(ElmoBiLM, ElmoLanguageModel))


# ---------------------------------------------------------------------------- static word vectors

STATIC_FILE = "vectors.npz"


def _static_detect(path: Path) -> bool:
    """A vectors file (GloVe / word2vec / fastText text or binary, npz) or a folder with ``vectors.npz``."""
    path = Path(path)
    if path.is_dir():
        return (path / STATIC_FILE).is_file() and not (path / "config.json").is_file()

    return path.is_file() and _base_suffix(path) in _SUFFIX_FORMATS  # .txt .vec .bin .npz, compressed or not


def _static_family() -> Family:
    def build(config: StaticVectorsConfig) -> WordVectors:
        return WordVectors([], np.zeros((0, config.dim), dtype=np.float32), meta={"config": config.__dict__})

    def load(path: Path):
        path = Path(path)
        return WordVectors.load(path / STATIC_FILE if path.is_dir() else path, progress=False), None

    def save(model, folder: PathLike, tokenizer=None) -> Path:
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        model.save(folder / STATIC_FILE, progress=False)
        return folder

    return Family(
        name="static", description="static word vectors: word2vec, fastText, GloVe files", list_kind="preset (static)",
        config_class=StaticVectorsConfig, presets=_presets(STATIC_PRESETS, STATIC_DESCRIPTIONS), build=build, load=load,
        save=save, detect=_static_detect, model_classes=(WordVectors,))


# ---------------------------------------------------------------------------- Transformer-XL


def _transformer_xl_family() -> Family:
    def load(folder: Path):
        """ctxkit's own folders (``train-transformer-xl``'s ``final/``): the model and its word
        list; HF folders: the model only (HF's vocabulary file is a pickle, never loaded here)."""
        if is_ctxkit_transformer_xl(folder):
            return load_transformer_xl_lm(folder)
        return load_transformer_xl(folder), None

    def save(model, folder: PathLike, tokenizer=None) -> Path:
        """ctxkit's format (safetensors + config.json + vocab.txt); ``tokenizer``: the word list."""
        if tokenizer is None:
            raise UserError("saving a word-level Transformer-XL needs its vocabulary (tokenizer=list of words)")
        return save_transformer_xl_lm(model, folder, list(tokenizer))

    return Family(
        name="transformer_xl", description="Transformer-XL language models with segment memory (Dai et al. 2019)",
        list_kind="preset (Transformer-XL)", config_class=TransformerXLConfig,
        presets=_presets(TRANSFO_XL_PRESETS, TRANSFO_XL_DESCRIPTIONS), build=TransformerXLLMHeadModel, load=load, save=save,
        detect=lambda folder: _model_type(folder) == "transfo-xl" or is_ctxkit_transformer_xl(folder),
        model_classes=(TransformerXLLMHeadModel, TransformerXLModel))


# ---------------------------------------------------------------------------- XLNet


def _xlnet_family() -> Family:
    def build(config: XLNetConfig) -> XLNetEncoder:
        return XLNetEncoder(XLNetModel(config))

    def load(folder: Path):
        """The task encoder (:class:`XLNetEncoder`), with its WordPiece vocabulary when saved."""
        tok = WordPieceTokenizer.from_dir(folder) if _has_any(folder, "vocab.txt", "tokenizer.json") else None
        model = XLNetEncoder.from_dir(folder)
        check_vocab_fits(model, tok, folder)
        return model, tok

    def save(model, folder: PathLike, tokenizer=None) -> Path:
        if isinstance(model, XLNetLMHeadModel):

            out = save_xlnet(model, folder)
            if tokenizer is not None:
                tokenizer.save(out)
            return out
        return model.save(folder, tokenizer)

    return Family(
        name="xlnet", description="XLNet permutation LMs (Yang et al. 2019), loaded as task encoders", list_kind="preset (XLNet)",
        config_class=XLNetConfig, presets=_presets(XLNET_PRESETS, XLNET_DESCRIPTIONS), build=build, load=load, save=save,
        detect=lambda folder: _model_type(folder) == "xlnet", model_classes=(XLNetEncoder, XLNetLMHeadModel, XLNetModel))


# ---------------------------------------------------------------------------- character LMs


def _char_lm_family(config_class: type, model_class: type, name: str, description: str) -> Family:
    """One of the two character LM families (one config class each): the deep Transformer
    and the LSTM baseline share presets' names (``char_*``), tokenizer and folder format."""
    def load(folder: Path):
        tok = CharTokenizer.from_dir(folder) if _has_any(folder, "vocab.json") else None
        model = load_char_lm(folder)
        check_vocab_fits(model, tok, folder)
        return model, tok

    presets = {k: v for k, v in CHAR_PRESETS.items() if isinstance(v, config_class)}
    model_type = next(t for t, (cls, _) in CHAR_MODEL_TYPES.items() if cls is model_class)
    return Family(
        name=name, description=description, list_kind="preset (char LM)", config_class=config_class,
        presets=_presets(presets, {k: CHAR_DESCRIPTIONS[k] for k in presets}), build=build_char_lm, load=load,
        save=_saving_tokenizer(save_char_lm), detect=lambda folder: _model_type(folder) == model_type,
        model_classes=(model_class,))


# ---------------------------------------------------------------------------- the registry

FAMILIES: Dict[str, Family] = {
    f.name: f
    for f in (
        _bert_family(),
        _gpt2_family(),
        _seq2seq_family(),
        _rnn_seq2seq_family(),
        _elmo_family(),
        _static_family(),
        _transformer_xl_family(),
        _xlnet_family(),
        _char_lm_family(CharTransformerConfig, CharTransformerLM, "char_transformer",
                        "character-level deep causal self-attention LMs (Al-Rfou et al. 2018)"),
        _char_lm_family(CharLSTMConfig, CharLSTMLM, "char_lstm", "character-level LSTM LMs (the recurrent baseline)"),
    )
}


def get_family(name: str) -> Family:
    """The family registered as ``name``.

    Raises:
        UnknownNameError: listing the known families.
    """
    try:
        return FAMILIES[name]
    except KeyError:
        raise UnknownNameError(f"unknown model family {name!r}; known: {', '.join(FAMILIES)}") from None


def preset_family(preset: str) -> Optional[Family]:
    """The family that owns the preset ``preset``, or None."""
    return next((f for f in FAMILIES.values() if preset in f.presets), None)


def find_family(folder_or_model: Any) -> Optional[Family]:
    """The family of a folder (or file) or of a model object, or None when no family claims it."""
    if isinstance(folder_or_model, (str, os.PathLike)):
        path = Path(folder_or_model)
        if not path.exists():
            return None
        return next((f for f in FAMILIES.values() if f.detect(path)), None)
    return next((f for f in FAMILIES.values() if isinstance(folder_or_model, f.model_classes)), None)


def family_of(folder_or_model: Any) -> Family:
    """The family of a folder (or file) or of a model object.

    Raises:
        UserError: no family recognises it (the message names what each family looks for).
    """
    family = find_family(folder_or_model)
    if family is None:
        what = (str(folder_or_model) if isinstance(folder_or_model, (str, os.PathLike))
                else f"a {type(folder_or_model).__name__}")
        raise UserError(f"{what} is no model of a known family ({', '.join(FAMILIES)}): HF folders need config.json "
                        "with a model_type; ELMo folders options.json; static vectors a vectors file")
    return family


def build_model(config: Any) -> Any:
    """A model of ``config`` with fresh (random) weights, built by the family whose config
    class it is (a BERT config builds a ``BertModel``, a GPT-2 config a ``GPT2LMHeadModel``...).

    Raises:
        UserError: a config no family owns.
    """
    family = next((f for f in FAMILIES.values() if type(config) is f.config_class), None)
    if family is None:
        raise UserError(f"a {type(config).__name__} is the config of no model family ({', '.join(FAMILIES)})")
    return family.build(config)


def load_model(folder: PathLike, family: Optional[str] = None) -> Tuple[Any, Any]:
    """``(model, tokenizer)`` of a model folder (the tokenizer None where it holds none).

    Args:
        folder: a model folder of any family.
        family: the family it must be (e.g. ``"gpt2"`` for a command that samples text):
            a folder of another family is refused, naming both.

    Raises:
        UserError: no family recognises the folder, or it is not of ``family``.
    """
    found = family_of(folder)
    if family is not None and found.name != family:
        raise UserError(f"{folder} holds a {found.name} model, not a {get_family(family).name} one")
    return found.load(Path(folder))

