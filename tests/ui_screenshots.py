"""Screenshots of the ``ctxkit ui`` panels for docs/ui.md (docs/images/ui-*.png), taken in
Debian's headless chromium as tests/test_ui_browser.py drives it::

    .venv/bin/python tests/ui_screenshots.py --out docs/images --encoder all_minilm_l6_v2 \\
        --qa runs/qa --ner runs/ner --generator runs/gpt

A role left out gets the tests' tiny random model (tests/ui_models.py); fill-mask always
does unless ``--fill-mask`` names a checkpoint with its masked-LM head. Each PNG is one
panel, reduced to a 128-colour palette to stay small.
"""

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from ui_browser import chromium, serving, submit, wait_for  # noqa: E402
from ui_models import tiny_ui_folders  # noqa: E402

from ctxkit.inference.pipelines import pipeline  # noqa: E402
from ctxkit.inference.ui import create_ui_app, load_ui_models  # noqa: E402

INPUTS = {
    "similarity": {},  # the page's own example: bank, four river and four money sentences
    "attention": {"text": "The bank raised its interest rates again."},
    "fill-mask": {"text": "john lives in [MASK] .", "top_k": 5},
    "qa": {"question": "What did Tesla's alternating current system power?",
           "context": "Nikola Tesla developed the alternating current system that powered the 1893 Chicago World's Fair, "
                      "and George Westinghouse bought his patents."},
    "ner": {"text": "Angela Merkel met Emmanuel Macron in Paris before flying to Washington for talks with Microsoft."},
    "generate": {"prompt": "It was a truth universally acknowledged that", "max_new_tokens": 40, "temperature": 0.8,
                 "top_k": 40, "top_p": 0.95, "seed": 3},
}


def _small_png(path: Path) -> None:
    from PIL import Image

    image = Image.open(path).convert("RGB")
    image.quantize(colors=128, method=Image.Quantize.MEDIANCUT).save(path, optimize=True)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("docs/images"))
    for role in ("encoder", "qa", "ner", "generator", "fill-mask"):
        parser.add_argument(f"--{role}", default=None)
    args = parser.parse_args(argv)
    tiny = tiny_ui_folders(Path(tempfile.mkdtemp(prefix="ui-shots-")))
    models = load_ui_models(encoder=args.encoder or str(tiny["encoder"]), qa=args.qa or str(tiny["qa"]),
                            ner=args.ner or str(tiny["ner"]), generator=args.generator or str(tiny["generator"]), device="cpu")
    masked = args.fill_mask or str(tiny["encoder"])
    models.fill_mask = pipeline("fill-mask", masked, device="cpu")
    tiny_name = "a tiny test model with random weights (tests/ui_models.py)"
    models.names["fill_mask"] = Path(masked).name if args.fill_mask else tiny_name
    for role, given in (("qa", args.qa), ("ner", args.ner), ("generator", args.generator)):
        if not given:
            models.names[role] = tiny_name
    args.out.mkdir(parents=True, exist_ok=True)
    with serving(create_ui_app(models)) as url, chromium(width=1120, height=2400) as driver:
        driver.get(url + "/")
        wait_for(driver, "return document.body.dataset.ready === 'true'")
        for panel, fields in INPUTS.items():
            state = submit(driver, panel, fields, timeout=120)
            if state != "done":
                raise SystemExit(f"{panel}: {driver.find_element('css selector', f'#panel-{panel} .error').text}")
            if panel == "attention":  # a head of the middle layer, drawn large
                heads = driver.find_elements("css selector", "#panel-attention .heads canvas")
                heads[len(heads) // 2 + 1].click()
            time.sleep(0.2)
            path = args.out / f"ui-{panel}.png"
            driver.find_element("id", f"panel-{panel}").screenshot(str(path))
            _small_png(path)
            print(f"{path}: {path.stat().st_size // 1024} KiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
