"""The host's work per text when a text task predicts (what a server's model thread and
``ctxkit predict`` spend besides the encoder): ``predict_lines`` over SST-2 dev sentences in
batches of 256, with a stand-in model that returns zeros, so only tokenizing, featurizing,
collating and formatting are timed. An engineering probe for docs/notes/gpu-serving.md (no
record): run it on two trees to compare them, e.g.

    PYTHONPATH=src python benchmarks/host_per_text.py --tokenizer MINILM_DIR --data ../shared/data
    PYTHONPATH=OLD_TREE/src python benchmarks/host_per_text.py --tokenizer MINILM_DIR --data ../shared/data
"""

from __future__ import annotations

import argparse
import logging
import time
from pathlib import Path

import torch

from ctxkit.tasks.text import GlueClassificationTask
from ctxkit.tokenizers import WordPieceTokenizer


class ZeroModel(torch.nn.Module):
    """Logits of zeros: the encoder's time left out."""

    def forward(self, input_ids, token_type_ids=None, attention_mask=None, **_):
        return {"logits": torch.zeros(input_ids.shape[0], 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokenizer", required=True, help="a folder with an uncased BERT WordPiece vocabulary")
    parser.add_argument("--data", required=True, help="the shared data folder (glue/SST-2/dev.tsv)")
    parser.add_argument("--repeats", type=int, default=12)
    args = parser.parse_args()
    logging.disable(logging.WARNING)  # every batch would say how many texts were cut
    tok = WordPieceTokenizer.from_dir(args.tokenizer)
    rows = (Path(args.data) / "glue" / "SST-2" / "dev.tsv").read_text(encoding="utf-8").splitlines()[1:]
    texts = [r.split("\t")[0] for r in rows]
    task = GlueClassificationTask("SST-2")
    task.labels = ["0", "1"]
    model = ZeroModel()
    batches = [texts[i:i + 256] for i in range(0, len(texts) - 255, 256)] * args.repeats
    task.predict_lines(model, tok, batches[0], batch_size=256, device="cpu")
    for _ in range(3):
        start, cpu = time.perf_counter(), time.thread_time()
        for batch in batches:
            task.predict_lines(model, tok, batch, batch_size=256, device="cpu")
        n = sum(map(len, batches))
        print(f"{n / (time.perf_counter() - start):,.0f} texts/s, {(time.thread_time() - cpu) * 1e6 / n:.1f} us of the "
              f"calling thread's CPU per text ({torch.get_num_threads()} torch threads)", flush=True)


if __name__ == "__main__":
    main()
