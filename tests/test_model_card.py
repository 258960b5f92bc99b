"""A fine-tuned run folder carries a model card (issue 38 item 4): ``RUN/README.md`` with
the Hub's YAML front matter (its model-index holds exactly the scores of results.json), the
command as typed, the hyper-parameters, the fast plan and how to use the folder."""

import json

import yaml

from ctxkit.cli import main
from ctxkit.tasks.model_card import model_card


def test_finetune_writes_a_card_the_hub_would_render(tiny_bert_dir, sst_table, tmp_path, capsys):
    run = tmp_path / "my-sst"
    argv = ["finetune", "table", "--model", str(tiny_bert_dir), "--data", str(sst_table), "--out", str(run), "--epochs", "1",
            "--batch-size", "8", "--max-length", "32", "--lr", "1e-3", "--device", "cpu", "--no-progress"]
    assert main(argv) == 0
    capsys.readouterr()
    card = (run / "README.md").read_text(encoding="utf-8")
    results = json.loads((run / "results.json").read_text(encoding="utf-8"))
    assert card.startswith("---\n")
    front = yaml.safe_load(card.split("---\n")[1])
    assert front["library_name"] == "ctxkit" and front["pipeline_tag"] == "text-classification"
    entries = front["model-index"][0]["results"]
    assert front["model-index"][0]["name"] == "my-sst"
    assert {e["dataset"]["split"]: {m["type"]: m["value"] for m in e["metrics"]} for e in entries} == \
        {split: {k: v for k, v in m.items() if isinstance(v, (int, float))} for split, m in results["results"].items()}
    assert "ctxkit " + " ".join(argv) in card  # the command as typed
    assert f"Fast plan: `{results['fast']}`" in card and "| lr | 0.001 |" in card
    assert "ctxkit predict my-sst input.txt" in card and "## Results" in card


def test_card_of_a_stopped_run_and_a_hub_base_model():
    info = {"task": "conll2003", "model": "dslim/bert-base-NER", "data": "/data/conll2003", "config": {"epochs": 3},
            "options": {"labels": ["O", "B-PER"]}}
    summary = {"results": {"dev": {"f1": 91.2345, "precision": 90.0}}, "stopped": {"reason": "max_minutes", "step": 120},
               "fast": "auto", "best_epoch": 1, "steps": 120}
    card = model_card("ner-run", info, summary, None)
    front = yaml.safe_load(card.split("---\n")[1])
    assert front["base_model"] == "dslim/bert-base-NER" and front["pipeline_tag"] == "token-classification"
    assert front["model-index"][0]["results"][0]["metrics"] == [{"type": "f1", "value": 91.2345}, {"type": "precision", "value": 90.0}]
    assert "stopped by `--max-minutes` at step 120" in card and "```bash" in card and "## Training" in card
