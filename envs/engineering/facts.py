"""What an engineering task's generator tells its verifier (`task.hidden.checks`), typed."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

from gymfoundry.envs.family import HiddenFacts

Kind = Literal["bad_config", "bad_timeout", "bad_deploy", "pool_exhausted", "disk_full", "expired_credentials", "poison_queue"]


class Cause(BaseModel):
    """One root cause of the incident: what is wrong, where, and how many hops upstream of the symptom."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    service: str
    kind: Kind
    depth: int  # dependency hops from the symptom service
    path: list[str]  # the services from the symptom to this cause, both included


class EngineeringFacts(HiddenFacts):
    symptom: str  # the service users report (named in the goal, so visible)
    causes: list[Cause]
    involved: list[str]  # every service on a path from the symptom to a cause: changes elsewhere are collateral
    herrings: list[str] = []  # healthy services made to look suspicious
