"""The README's two setup commands stay true: CI runs the second verbatim."""

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
    ci = [line for line in (REPO / ".ci" / "run").read_text().splitlines() if line and not line.startswith(("#", "set ", "cd "))]
    assert ci == [tests]
