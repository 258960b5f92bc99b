"""The public checkpoints ctxkit knows by name: data only, read by :mod:`ctxkit.zoo`.

Three tables:

* :data:`HUB_MODELS`: Hugging Face Hub repositories of every family ctxkit implements, each
  with the ctxkit preset it instantiates, a pinned revision (a commit of the repository;
  None where no commit could be pinned: the default branch is used) and the other names
  users type for it (the legacy top-level ids such as ``bert-base-uncased``);
* :data:`GLUON_NAMES`: the lectures' GluonNLP names (``get_model("bert_12_768_12",
  dataset_name="book_corpus_wiki_en_uncased")``), each mapped to the Hub repository holding
  the same release or its closest public equivalent, and saying which;
* :data:`URL_MODELS`: checkpoints published as plain files (AllenNLP's ELMo), each file with
  its URL and SHA-256.

``docs/zoo.md`` is generated from these tables (``python -m ctxkit list-models --markdown``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, Mapping, Optional, Tuple

__all__ = ["HubModel", "GluonName", "UrlModel", "HUB_MODELS", "GLUON_NAMES", "URL_MODELS", "SAME", "EQUIVALENT", "NO_COPY",
           "hub_model", "gluon_name"]

SAME = "same weights"
EQUIVALENT = "equivalent"
NO_COPY = "no public copy"


@dataclass(frozen=True)
class HubModel:
    """A model repository on the Hugging Face Hub.

    Attributes:
        repo_id: the repository's current id (``google-bert/bert-base-uncased``).
        family: the ctxkit family that loads it (:data:`ctxkit.zoo.families.FAMILIES`).
        preset: the ctxkit preset with its architecture (None: no preset has it; config.json says).
        revision: the pinned commit, or None for the default branch.
        description: one line for listings.
        aliases: other names that mean this repository (legacy ids, short names).
    """

    repo_id: str
    family: str
    preset: Optional[str]
    revision: Optional[str]
    description: str
    aliases: Tuple[str, ...] = ()


@dataclass(frozen=True)
class GluonName:
    """One GluonNLP ``(model, dataset_name)`` pair and where its weights are today.

    Attributes:
        model: GluonNLP's model name, which is also ctxkit's preset name.
        dataset_name: GluonNLP's name of the pretraining data / release.
        target: a :data:`HUB_MODELS` id or a :data:`URL_MODELS` name; None without any public copy.
        relation: :data:`SAME` (the same release), :data:`EQUIVALENT` (a public copy of the
            closest release) or :data:`NO_COPY`.
        note: where GluonNLP's weights came from and how the target relates to them.
    """

    model: str
    dataset_name: str
    target: Optional[str]
    relation: str
    note: str


@dataclass(frozen=True)
class UrlModel:
    """A checkpoint published as plain files.

    Attributes:
        name: ctxkit's name (``allennlp/<preset>``: the publisher, then the architecture's preset name).
        family: the family that loads the folder the files are put in.
        preset: the ctxkit preset.
        files: local file name -> ``(url, sha256)``; sha256 None: recorded at the first download.
        description: one line for listings.
        aliases: other names.
    """

    name: str
    family: str
    preset: str
    files: Mapping[str, Tuple[str, Optional[str]]]
    description: str
    aliases: Tuple[str, ...] = field(default=())


def _hub(repo_id, family, preset, revision, description, *aliases) -> HubModel:
    return HubModel(repo_id, family, preset, revision, description, tuple(aliases))


HUB_MODELS: Dict[str, HubModel] = {m.repo_id: m for m in (
    # BERT (Devlin et al. 2019): Google's original releases, converted by Hugging Face
    _hub("google-bert/bert-base-uncased", "bert", "bert_12_768_12", "86b5e0934494bd15c9632b12f734a8a67f723594",
         "BERT-base uncased, Google's release (English Wikipedia + BooksCorpus)", "bert-base-uncased"),
    _hub("google-bert/bert-base-cased", "bert", "bert_12_768_12", "cd5ef92a9fb2f889e972770a36d4ed042daf221e",
         "BERT-base cased, Google's release", "bert-base-cased"),
    _hub("google-bert/bert-large-uncased", "bert", "bert_24_1024_16", "6da4b6a26a1877e173fca3225479512db81a5e5b",
         "BERT-large uncased, Google's release", "bert-large-uncased"),
    _hub("google-bert/bert-large-cased", "bert", "bert_24_1024_16", "d9238236d8326ce4bc117132bb3b7e62e95f3a9a",
         "BERT-large cased, Google's release", "bert-large-cased"),
    _hub("google-bert/bert-base-multilingual-uncased", "bert", "bert_12_768_12", None,
         "multilingual BERT-base uncased (102 Wikipedias), Google's release", "bert-base-multilingual-uncased"),
    _hub("google-bert/bert-base-multilingual-cased", "bert", "bert_12_768_12", "3f076fdb1ab68d5b2880cb87a0886f315b8146f8",
         "multilingual BERT-base cased (104 Wikipedias), Google's release", "bert-base-multilingual-cased"),
    _hub("google-bert/bert-base-chinese", "bert", "bert_12_768_12", "8f23c25b06e129b6c986331a13d8d025a92cf0ea",
         "Chinese BERT-base (character vocabulary), Google's release", "bert-base-chinese"),
    # DistilBERT (Sanh et al. 2019)
    _hub("distilbert/distilbert-base-uncased", "bert", "distilbert_6_768_12", "12040accade4e8a0f71eabdb258fecc2e7e948be",
         "DistilBERT-base uncased, distilled from BERT-base (the lectures' feature-extraction model)",
         "distilbert-base-uncased"),
    _hub("distilbert/distilbert-base-cased", "bert", "distilbert_6_768_12", "6ea81172465e8b0ad3fddeed32b986cdcdcffcf0",
         "DistilBERT-base cased", "distilbert-base-cased"),
    # Sentence-Transformers' MiniLM (ctxkit's packaged checkpoint all_minilm_l6_v2 holds the same files)
    _hub("sentence-transformers/all-MiniLM-L6-v2", "bert", "bert_6_384_12", "c9745ed1d9f207416be6d2e6f8de32d1f16199bf",
         "all-MiniLM-L6-v2 (6 x 384, uncased): a small sentence encoder", "all-MiniLM-L6-v2"),
    # Domain BERTs (the GluonNLP table's targets)
    _hub("allenai/scibert_scivocab_uncased", "bert", "bert_12_768_12", "24f92d32b1bfb0bcaf9ab193ff3ad01e87732fc1", "SciBERT, scivocab, uncased (AllenAI)"),
    _hub("allenai/scibert_scivocab_cased", "bert", "bert_12_768_12", None, "SciBERT, scivocab, cased (AllenAI)"),
    _hub("dmis-lab/biobert-v1.1", "bert", "bert_12_768_12", "551ca18efd7f052c8dfa0b01c94c2a8e68bc5488", "BioBERT v1.1 (+PubMed 1M steps), cased (DMIS lab)"),
    _hub("emilyalsentzer/Bio_ClinicalBERT", "bert", "bert_12_768_12", "d5892b39a4adaed74b92212a44081509db72f87b",
         "Bio+ClinicalBERT (Alsentzer et al. 2019): BioBERT further trained on MIMIC-III notes"),
    # GPT-2 (Radford et al. 2019)
    _hub("openai-community/gpt2", "gpt2", "gpt2_117m", "607a30d783dfa663caf39e06633721c8d4cfcd7e", "GPT-2 small (124M), OpenAI's release", "gpt2"),
    _hub("openai-community/gpt2-medium", "gpt2", "gpt2_345m", "6dcaa7a952f72f9298047fd5137cd6e4f05f41da", "GPT-2 medium (355M)", "gpt2-medium"),
    _hub("openai-community/gpt2-large", "gpt2", "gpt2_774m", "32b71b12589c2f8d625668d2335a01cac3249519", "GPT-2 large (774M)", "gpt2-large"),
    _hub("openai-community/gpt2-xl", "gpt2", "gpt2_1558m", "15ea56dee5df4983c59b2538573817e1667135e2", "GPT-2 XL (1.5B)", "gpt2-xl"),
    _hub("distilbert/distilgpt2", "gpt2", None, "2290a62682d06624634c1f46a6ad5be0f47f38aa", "DistilGPT2 (6 layers, distilled from GPT-2 small)",
         "distilgpt2"),
    # XLNet (Yang et al. 2019) and Transformer-XL (Dai et al. 2019)
    _hub("xlnet/xlnet-base-cased", "xlnet", "xlnet_12_768_12", "ceaa69c7bc5e512b5007106a7ccbb7daf24b2c79", "XLNet-base cased, the authors' release",
         "xlnet-base-cased"),
    _hub("xlnet/xlnet-large-cased", "xlnet", "xlnet_24_1024_16", None, "XLNet-large cased", "xlnet-large-cased"),
    _hub("transfo-xl/transfo-xl-wt103", "transformer_xl", "transfo_xl_base_wt103", None,
         "Transformer-XL trained on WikiText-103 (the paper's 18-layer model)", "transfo-xl-wt103"),
)}

_ELMO = "https://s3-us-west-2.amazonaws.com/allennlp/models/elmo"


def _elmo(name: str, folder: str, options_sha: Optional[str], weights_sha: Optional[str], description: str) -> UrlModel:
    return UrlModel(name=f"allennlp/{name}", family="elmo", preset=name, description=description, files={
        "options.json": (f"{_ELMO}/{folder}/elmo_{folder}_options.json", options_sha),
        "weights.hdf5": (f"{_ELMO}/{folder}/elmo_{folder}_weights.hdf5", weights_sha),
    })


# AllenNLP publishes no checksums of these files and this project could not reach them to
# hash them: sha256 None means "recorded at the first download" (ctxkit.core.fetch keeps a
# SHA256SUMS beside the files and checks every later load against it). Put the digests here
# once a networked machine has fetched them (ctxkit download NAME prints them).
URL_MODELS: Dict[str, UrlModel] = {m.name: m for m in (
    _elmo("elmo_2x1024_128_2048cnn_1xhighway", "2x1024_128_2048cnn_1xhighway", None, None,
          "ELMo small (AllenNLP): 1 Billion Word benchmark"),
    _elmo("elmo_2x2048_256_2048cnn_1xhighway", "2x2048_256_2048cnn_1xhighway", None, None,
          "ELMo medium (AllenNLP): 1 Billion Word benchmark"),
    _elmo("elmo_2x4096_512_2048cnn_2xhighway", "2x4096_512_2048cnn_2xhighway", None, None,
          "ELMo original (AllenNLP, Peters et al. 2018): 1 Billion Word benchmark"),
    UrlModel(name="allennlp/elmo_2x4096_512_2048cnn_2xhighway_5.5B", family="elmo", preset="elmo_2x4096_512_2048cnn_2xhighway",
             description="ELMo original (5.5B tokens: Wikipedia + WMT news crawl), AllenNLP", files={
                 "options.json": (f"{_ELMO}/2x4096_512_2048cnn_2xhighway_5.5B/elmo_2x4096_512_2048cnn_2xhighway_5.5B_options.json",
                                  None),
                 "weights.hdf5": (f"{_ELMO}/2x4096_512_2048cnn_2xhighway_5.5B/elmo_2x4096_512_2048cnn_2xhighway_5.5B_weights.hdf5",
                                  None)}),
)}

_GOOGLE = "GluonNLP converted Google's original release; so did Hugging Face"


def _g(model, dataset_name, target, relation, note) -> GluonName:
    return GluonName(model, dataset_name, target, relation, note)


GLUON_NAMES: Tuple[GluonName, ...] = (
    _g("bert_12_768_12", "book_corpus_wiki_en_uncased", "google-bert/bert-base-uncased", SAME, _GOOGLE),
    _g("bert_12_768_12", "book_corpus_wiki_en_cased", "google-bert/bert-base-cased", SAME, _GOOGLE),
    _g("bert_24_1024_16", "book_corpus_wiki_en_uncased", "google-bert/bert-large-uncased", SAME, _GOOGLE),
    _g("bert_24_1024_16", "book_corpus_wiki_en_cased", "google-bert/bert-large-cased", SAME, _GOOGLE),
    _g("bert_12_768_12", "openwebtext_book_corpus_wiki_en_uncased", "google-bert/bert-base-uncased", EQUIVALENT,
       "GluonNLP pretrained its own BERT-base on OpenWebText + BooksCorpus + Wikipedia and no copy is public; "
       "Google's BERT-base uncased (same architecture and vocabulary) stands in"),
    _g("bert_12_768_12", "wiki_multilingual_uncased", "google-bert/bert-base-multilingual-uncased", SAME, _GOOGLE),
    _g("bert_12_768_12", "wiki_multilingual_cased", "google-bert/bert-base-multilingual-cased", SAME, _GOOGLE),
    _g("bert_12_768_12", "wiki_cn_cased", "google-bert/bert-base-chinese", SAME, _GOOGLE),
    _g("bert_12_768_12", "scibert_scivocab_uncased", "allenai/scibert_scivocab_uncased", SAME,
       "SciBERT (Beltagy et al. 2019), AllenAI's release"),
    _g("bert_12_768_12", "scibert_scivocab_cased", "allenai/scibert_scivocab_cased", SAME,
       "SciBERT (Beltagy et al. 2019), AllenAI's release"),
    _g("bert_12_768_12", "scibert_basevocab_uncased", "allenai/scibert_scivocab_uncased", EQUIVALENT,
       "the basevocab SciBERT (BERT's own vocabulary) is published by AllenAI as a TensorFlow/PyTorch archive, not on the "
       "Hub; the scivocab model of the same corpus stands in (its vocabulary differs)"),
    _g("bert_12_768_12", "scibert_basevocab_cased", "allenai/scibert_scivocab_cased", EQUIVALENT,
       "as scibert_basevocab_uncased, cased"),
    _g("bert_12_768_12", "biobert_v1.1_pubmed_cased", "dmis-lab/biobert-v1.1", SAME,
       "BioBERT v1.1 (Lee et al. 2019), DMIS lab's release"),
    _g("bert_12_768_12", "biobert_v1.0_pubmed_cased", "dmis-lab/biobert-v1.1", EQUIVALENT,
       "BioBERT v1.0 weights are released only as TensorFlow checkpoints; v1.1 (PubMed, 1M steps) stands in"),
    _g("bert_12_768_12", "biobert_v1.0_pmc_cased", "dmis-lab/biobert-v1.1", EQUIVALENT,
       "BioBERT v1.0 (+PMC) is released only as TensorFlow checkpoints; v1.1 (PubMed) stands in"),
    _g("bert_12_768_12", "biobert_v1.0_pubmed_pmc_cased", "dmis-lab/biobert-v1.1", EQUIVALENT,
       "BioBERT v1.0 (+PubMed+PMC) is released only as TensorFlow checkpoints; v1.1 (PubMed) stands in"),
    _g("bert_12_768_12", "clinicalbert_uncased", None, NO_COPY,
       "GluonNLP's ClinicalBERT is Huang et al. 2019's (uncased), released as a PyTorch archive on GitHub, not on the Hub; "
       "the closest Hub model, emilyalsentzer/Bio_ClinicalBERT, is another ClinicalBERT (Alsentzer et al., cased)"),
    _g("ernie_12_768_12", "baidu_ernie_uncased", None, NO_COPY,
       "ERNIE 1.0 (Baidu) is published in PaddlePaddle; the Hub's conversions (nghuyong/ernie-1.0-base-zh) use "
       "transformers' Ernie layout (model_type ernie), which ctxkit does not load"),
    _g("bert_12_768_12", "ernie_baidu_cn_uncased", None, NO_COPY, "the lecture's name of ERNIE 1.0: see ernie_12_768_12"),
    _g("distilbert_6_768_12", "distilbert_book_corpus_wiki_en_uncased", "distilbert/distilbert-base-uncased", SAME,
       "GluonNLP converted Hugging Face's DistilBERT"),
    _g("distilbert_6_768_12", "distil_book_corpus_wiki_en_uncased", "distilbert/distilbert-base-uncased", SAME,
       "the name GluonNLP's documentation uses for the row above"),
    _g("elmo_2x1024_128_2048cnn_1xhighway", "gbw", "allennlp/elmo_2x1024_128_2048cnn_1xhighway", SAME, "AllenNLP's release"),
    _g("elmo_2x2048_256_2048cnn_1xhighway", "gbw", "allennlp/elmo_2x2048_256_2048cnn_1xhighway", SAME, "AllenNLP's release"),
    _g("elmo_2x4096_512_2048cnn_2xhighway", "gbw", "allennlp/elmo_2x4096_512_2048cnn_2xhighway", SAME, "AllenNLP's release"),
    _g("elmo_2x4096_512_2048cnn_2xhighway", "5bw", "allennlp/elmo_2x4096_512_2048cnn_2xhighway_5.5B", SAME,
       "AllenNLP's 5.5B-token release"),
    _g("gpt2_117m", "openai_webtext", "openai-community/gpt2", SAME, "OpenAI's release"),
    _g("gpt2_345m", "openai_webtext", "openai-community/gpt2-medium", SAME, "OpenAI's release"),
    _g("xlnet_12_768_12", "126gb", "xlnet/xlnet-base-cased", SAME, "the authors' release (GluonNLP: xlnet_cased_l12_h768_a12)"),
    _g("xlnet_cased_l12_h768_a12", "126gb", "xlnet/xlnet-base-cased", SAME, "the authors' release"),
    _g("xlnet_24_1024_16", "126gb", "xlnet/xlnet-large-cased", SAME, "the authors' release (GluonNLP: xlnet_cased_l24_h1024_a16)"),
    _g("xlnet_cased_l24_h1024_a16", "126gb", "xlnet/xlnet-large-cased", SAME, "the authors' release"),
    _g("transfo_xl_base_wt103", "wt103", "transfo-xl/transfo-xl-wt103", SAME,
       "the authors' WikiText-103 model (GluonNLP hosts none; its script converts this release)"),
)


def hub_model(name: str) -> Optional[HubModel]:
    """The :data:`HUB_MODELS` entry named ``name`` (its id or an alias, case-sensitive as on
    the Hub), or None."""
    if name in HUB_MODELS:
        return HUB_MODELS[name]
    return next((m for m in HUB_MODELS.values() if name in m.aliases), None)


def gluon_name(model: str, dataset_name: str) -> Optional[GluonName]:
    """The :data:`GLUON_NAMES` row of ``(model, dataset_name)``, or None."""
    return next((g for g in GLUON_NAMES if g.model == model and g.dataset_name == dataset_name), None)
