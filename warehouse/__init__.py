"""DuckDB catalog + Parquet lake partitioned by `task_family`, with table schemas derived
from the records in `envs.records`. See `Warehouse`."""

from warehouse.schema import Column, arrow_schema, column_for, from_row, model_columns, to_row
from warehouse.store import CATALOG_FILE, DEFAULT_DATA_DIR, QUARANTINE_DIR, Landing, QuarantinedBatch, Warehouse
from warehouse.tables import PARTITION, TABLES, Reference, Table

__all__ = [
    "CATALOG_FILE", "DEFAULT_DATA_DIR", "PARTITION", "QUARANTINE_DIR", "TABLES", "Column", "Landing",
    "QuarantinedBatch", "Reference", "Table", "Warehouse", "arrow_schema", "column_for", "from_row",
    "model_columns", "to_row",
]
