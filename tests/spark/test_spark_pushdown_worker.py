"""What ``tidelog.spark.source.called_by_pyspark_pushdown_worker`` relies on in PySpark, checked
against the installed PySpark (no Java needed): an upgrade that changes it fails here, naming
the change, instead of as a read that silently loses its pushdown or fails with
DATA_SOURCE_PUSHDOWN_DISABLED."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path
from types import ModuleType

import pyspark
from pyspark.sql.worker import data_source_pushdown_filters, plan_data_source_read

from tidelog.spark.columns import source_schema
from tidelog.spark.source import (
    PUSHDOWN_WORKER_FILE,
    TidelogBatchReader,
    TidelogDataSource,
    TidelogPushdownReader,
)

RELIED_ON = (
    f"tidelog.spark.source.called_by_pyspark_pushdown_worker relies on it (PySpark "
    f"{pyspark.__version__}): read its docstring and find how this PySpark asks for the reader "
    f"it pushes filters to"
)


def _calls(module: ModuleType) -> dict[str, set[str]]:
    """For each top-level function of ``module``: the names of the methods it calls."""
    tree = ast.parse(inspect.getsource(module))
    return {
        node.name: {
            call.func.attr
            for call in ast.walk(node)
            if isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)
        }
        for node in tree.body
        if isinstance(node, ast.FunctionDef)
    }


def test_the_pushdown_worker_calls_reader_then_push_filters_itself() -> None:
    assert Path(data_source_pushdown_filters.__file__).name == PUSHDOWN_WORKER_FILE, (
        f"PySpark's filter-pushdown worker is no longer in a file named {PUSHDOWN_WORKER_FILE}; "
        + RELIED_ON
    )
    callers = [
        name
        for name, called in _calls(data_source_pushdown_filters).items()
        if {"reader", "pushFilters"} <= called
    ]
    assert callers, (
        f"no function of {PUSHDOWN_WORKER_FILE} calls both DataSource.reader() and "
        f"pushFilters() any more; " + RELIED_ON
    )


def test_the_plan_worker_refuses_push_filters_when_pushdown_is_off() -> None:
    calls = _calls(plan_data_source_read)
    assert not any("pushFilters" in called for called in calls.values()), (
        "PySpark's plan worker (plan_data_source_read.py) now calls pushFilters itself, so the "
        "plain reader it gets would ignore pushed filters; " + RELIED_ON
    )
    assert "DATA_SOURCE_PUSHDOWN_DISABLED" in inspect.getsource(plan_data_source_read), (
        "PySpark's plan worker no longer refuses readers that override pushFilters while "
        "spark.sql.python.filterPushdown.enabled is off: the detection may be unnecessary "
        "(always hand out TidelogPushdownReader); " + RELIED_ON
    )


def test_only_the_pushdown_worker_gets_the_reader_with_push_filters(tmp_path: Path) -> None:
    source = TidelogDataSource({"stream": "events"})
    schema = source_schema()  # what Spark hands reader(): the source's (or the user's) schema
    assert type(source.reader(schema)) is TidelogBatchReader
    # The same call, made from code whose file is named like PySpark's pushdown worker.
    worker = compile("reader = source.reader(schema)", str(tmp_path / PUSHDOWN_WORKER_FILE), "exec")
    scope = {"source": source, "schema": schema}
    exec(worker, scope)
    assert type(scope["reader"]) is TidelogPushdownReader
