"""A family's gameability audit landed in a test's data dir, as the factory's audit stage lands
it: dataset assembly refuses a family without one. Each family is audited once per session."""

from functools import lru_cache

from gymfoundry.tasks.stages.audit import AuditReport, audit_family, land_audit
from gymfoundry.warehouse import Warehouse


@lru_cache(maxsize=None)
def audit(family: str) -> AuditReport:
    report = audit_family(family, episodes=1)
    assert report.ok, report.render()
    return report


def audited(data_dir, families) -> None:
    with Warehouse(data_dir) as wh:
        for family in families:
            land_audit(wh, audit(family))
