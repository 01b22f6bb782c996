"""In-memory DuckDB and SQLite connections holding a test's tables, closed after the test."""

from __future__ import annotations

import pytest


@pytest.fixture
def tables_in():
    """``tables_in(connection, "CREATE ...", ("INSERT ... (?, ?)", rows), ...)``: run the
    statements (a tuple runs once per row) and hand the connection back."""
    opened = []

    def build(connection, *statements):
        opened.append(connection)
        for statement in statements:
            if isinstance(statement, tuple):
                connection.executemany(*statement)
            else:
                connection.execute(statement)
        return connection

    yield build
    for connection in opened:
        connection.close()
