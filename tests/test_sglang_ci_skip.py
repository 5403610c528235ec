"""The real-SGLang cases skip where their environment is missing, except under CI (CI=true), where a missing
environment fails them: `.ci/run` builds it first, so a green run without it would have tested nothing."""

from __future__ import annotations

import pytest
from sglang_helpers import SGLANG_HINT, launch, skip_unless_ci


@pytest.mark.parametrize("ci", ["", "true"])
def test_a_missing_sglang_environment_skips_locally_and_fails_under_ci(monkeypatch, tmp_path, ci):
    monkeypatch.setenv("ROLLPACKER_SGLANG_VENV", str(tmp_path / "no-venv"))
    monkeypatch.setenv("CI", ci)
    outcome = pytest.fail.Exception if ci else pytest.skip.Exception
    with pytest.raises(outcome, match="make sglang") as info:
        launch("sglang", "unused-model")
    assert SGLANG_HINT in str(info.value)


def test_the_rule_reads_ci_as_ci_runners_set_it(monkeypatch):
    for value, outcome in (("1", pytest.fail.Exception), ("TRUE", pytest.fail.Exception), ("false", pytest.skip.Exception)):
        monkeypatch.setenv("CI", value)
        with pytest.raises(outcome):
            skip_unless_ci("why")
