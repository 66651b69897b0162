"""What the coding generator tells its grader (`task.hidden.checks`)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from gymfoundry.envs.family import HiddenFacts


class Bug(BaseModel):
    """One injected bug: `buggy` replaced `original` (once) in `file`; the fix is the inverse."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    id: str
    file: str
    kind: str
    original: str
    buggy: str
    distance: int  # 0: a visible test of its module fails, 1: only another module's, 2: only hidden tests


class CodingFacts(HiddenFacts):
    template: str
    package: str
    test_dir: str
    bugs: list[Bug]
    hidden_tests: dict[str, str]  # file name -> source; never in any path the agent can reach
    visible_tests: dict[str, str]  # workspace path -> the original source of each visible test file
