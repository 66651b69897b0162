"""DuckDB catalog + Parquet lake partitioned by `task_family`, with table schemas derived
from the records in `gymfoundry.envs.records`. See `Warehouse`."""

from gymfoundry.warehouse.schema import Column, arrow_schema, column_for, from_row, model_columns, to_row
from gymfoundry.warehouse.statements import ConsoleRefused
from gymfoundry.warehouse.store import (CATALOG_FILE, QUARANTINE_DIR, CatalogLocked, DamagedWarehouse, Landing,
                             QuarantinedBatch, Repair, Warehouse, assert_intact)
from gymfoundry.warehouse.staged import Staged, stage
from gymfoundry.warehouse.tables import PARTITION, TABLES, Reference, Table

__all__ = [
    "CATALOG_FILE", "PARTITION", "QUARANTINE_DIR", "TABLES", "CatalogLocked", "Column", "ConsoleRefused",
    "DamagedWarehouse", "Landing", "QuarantinedBatch", "Reference", "Repair", "Staged", "Table", "Warehouse", "arrow_schema",
    "assert_intact", "column_for", "from_row", "model_columns", "stage", "to_row",
]
