"""The README's two setup commands stay true: CI runs the second verbatim (after installing
chromium for the browser tests)."""

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_readme_has_exactly_two_setup_commands_and_ci_runs_the_second():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    setup = readme.split("## Setup", 1)[1].split("\n## ", 1)[0]
    commands = re.findall(r"```bash\n(.*?)\n```", setup, flags=re.S)
    assert len(commands) == 2 and all("\n" not in c for c in commands)
    demo, tests = commands
    assert demo.endswith("ctxkit demo") and "ctxkit download all_minilm_l6_v2" in demo and "[all]" in demo
    assert "pytest" in tests and "[test]" in tests
    run = (REPO / ".ci" / "run").read_text()
    # before it, CI installs chromium for the browser tests (tests/test_ui_browser.py): one if-block
    browser = re.search(r"^if .*chromium.*?^fi\n", run, flags=re.S | re.M)
    assert browser and "apt-get install -y -qq chromium chromium-driver" in browser.group(0)
    run = run.replace(browser.group(0), "")
    ci = [line for line in run.splitlines() if line and not line.startswith(("#", "set ", "cd "))]
    assert ci == [tests]
