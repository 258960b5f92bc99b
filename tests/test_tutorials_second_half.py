"""The second half of the tutorials in smoke mode: tests/test_tutorials.py's check, in a
module of its own so that pytest-xdist (--dist loadfile) runs the two halves on two workers."""

import pytest

from test_tutorials import SECOND_HALF, _ids, build  # noqa: F401 - build is the module fixture
from test_tutorials import test_tutorial_runs_in_smoke_mode as _smoke_run


@pytest.mark.parametrize("path", SECOND_HALF, ids=_ids)
def test_tutorial_runs_in_smoke_mode(path, build, shared_data, minilm_dir, record_property, tmp_path):  # noqa: F811
    _smoke_run(path, build, shared_data, minilm_dir, record_property, tmp_path)
