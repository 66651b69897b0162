"""What the read-only SQL console may run: queries, never statements that write files or change
the catalog or the connection (COPY ... TO, EXPORT, ATTACH, INSTALL/LOAD, CREATE, INSERT, SET,
PRAGMA, CALL, PREPARE/EXECUTE, ...).

A read-only DuckDB connection refuses catalog changes but still writes files (`COPY (...) TO`
overwrote an immutable batch), so every statement of the text is classified by DuckDB's own
parser (`duckdb.extract_statements`) before any of it runs. A read-only `Warehouse.sql` checks
every text here; `console` runs one bounded in time and memory.
"""

from __future__ import annotations

import duckdb

QUERY = duckdb.StatementType.SELECT  # SELECT, WITH, FROM-first, VALUES, DESCRIBE, SHOW, SUMMARIZE, UNPIVOT
PIVOTS = {"pivot", "pivot_wider"}    # PIVOT parses as MULTI (DuckDB plans it in two steps)
ALLOWED = "SELECT, WITH, FROM, VALUES, EXPLAIN [ANALYZE], DESCRIBE, SHOW, SUMMARIZE, PIVOT, UNPIVOT"


class ConsoleRefused(PermissionError):
    """A statement the read-only console does not run."""


def check_query(text: str) -> None:
    """Raise ConsoleRefused unless every statement in `text` only reads."""
    statements = duckdb.extract_statements(text)
    for number, statement in enumerate(statements, 1):
        refused = _refusal(statement)
        if refused:
            where = f" (statement {number} of {len(statements)})" if len(statements) > 1 else ""
            raise ConsoleRefused(f"the SQL console only runs queries ({ALLOWED}); {refused}{where} could write "
                                 "files or change the catalog and was refused; nothing was run")


def _refusal(statement) -> str | None:
    """None when the statement only reads, else its kind, for the message."""
    try:
        kind = statement.type
    except ValueError:  # a kind this DuckDB's Python API has no name for (`UPDATE EXTENSIONS`)
        return "a statement of a kind the console does not know"
    if kind == QUERY:
        return None
    words = _keywords(statement.query)
    if kind == duckdb.StatementType.MULTI and words[:1] and words[0][1] in PIVOTS:
        return None
    if kind == duckdb.StatementType.EXPLAIN:
        # EXPLAIN ANALYZE runs its statement: the statement after EXPLAIN [ANALYZE] must pass itself.
        rest = words[2:] if len(words) > 1 and words[1][1] == "analyze" else words[1:]
        if rest and rest[0][1] != "(":
            inner = duckdb.extract_statements(statement.query[rest[0][0]:])
            if len(inner) == 1 and _refusal(inner[0]) is None:
                return None
        return "EXPLAIN of a statement other than a query (or with options)"
    return kind.name


def _keywords(text: str) -> list[tuple[int, str]]:
    """(offset, lower-case text) of the tokens that are not comments, from DuckDB's tokenizer."""
    tokens = [(offset, kind) for offset, kind in duckdb.tokenize(text)]
    out = []
    for i, (offset, kind) in enumerate(tokens):
        if kind == duckdb.token_type.comment:
            continue
        end = tokens[i + 1][0] if i + 1 < len(tokens) else len(text)
        out.append((offset, text[offset:end].strip().lower()))
    return out
