"""The measured-runs schema: typed cells, row rules, and a file written then read gives the same rows."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lbbench.errors import InputError
from lbbench.measured import MeasuredRow, read_measured, write_measured
from lbbench.measured.schema import (BY_NAME, COLUMNS, METRIC_COLUMNS, ORDERED, CellError, MeasuredRowError,
                                     build_row, check_value, close_column, parse_cell)


def _err(problem, column=None):
    return MeasuredRowError("f.csv", problem, row=1, id="x", stage=0, column=column)


BASE = {"id": "x", "stage": 0, "model": "meta-llama/Llama-2-7b-hf", "gpu": "h100", "tp": 1, "arrival": "constant",
        "rate_rps": 5.0, "output_tokens": 247, "ttft_mean_ms": 25.0}


def test_cells_parse_to_their_types():
    assert parse_cell("stage", " 3 ") == 3 and parse_cell("stage", "4.0") == 4
    assert parse_cell("rate_rps", "39.64") == 39.64
    assert parse_cell("prefix_caching", "True") is True and parse_cell("ignore_eos", "no") is False
    assert parse_cell("engine_version", "0.15.1") == "0.15.1"  # a version stays text
    assert parse_cell("tp", "") is None
    for column, text, problem in (("tp", "two", "'two' is not an integer"), ("tp", "1.5", "'1.5' is not an integer"),
                                  ("rate_rps", "fast", "'fast' is not a number"),
                                  ("rate_rps", "nan", "'nan' is not a finite number"),
                                  ("multi_turn", "maybe", "'maybe' is not true or false")):
        with pytest.raises(CellError, match=f"^{problem}$".replace("(", r"\(").replace(")", r"\)")):
            parse_cell(column, text)


def test_values_are_checked_against_ranges_and_choices():
    assert check_value("arrival", "poisson") == "poisson"
    with pytest.raises(CellError, match=r"^unknown arrival kind 'gamma' \(known: poisson, constant, burst\)$"):
        check_value("arrival", "gamma")
    with pytest.raises(CellError, match=r"^0 must be >= 1$"):
        check_value("tp", 0)
    with pytest.raises(CellError, match=r"^0.0 must be > 0.0$"):
        check_value("rate_rps", 0.0)
    with pytest.raises(CellError, match=r"^1.2 must be <= 1.0$"):
        check_value("gpu_memory_utilization", 1.2)
    assert check_value("rate_rps", 5) == 5.0 and isinstance(check_value("rate_rps", 5), float)


def test_row_rules():
    assert build_row(BASE, error=_err).key == ("x", 0)
    cases = [({"arrival": None}, "arrival", "empty, but required"),
             ({"rate_rps": None}, "rate_rps", "empty, but required (a poisson or constant stage has a rate)"),
             ({"ttft_p50_ms": 30.0, "ttft_p90_ms": 20.0}, "ttft_p90_ms",
              "20.0 is below ttft_p50_ms 30.0: percentiles must not decrease"),
             ({"e2e_mean_ms": 20.0}, "e2e_mean_ms", "20.0 is below ttft_mean_ms 25.0: a TTFT cannot exceed the E2E "
                                                    "it is part of"),
             ({"prompt_tokens_mean": 600.0, "prompt_tokens_max": 500}, "prompt_tokens_max",
              "500 is below prompt_tokens_mean 600.0"),
             ({"ttft_mean_ms": None}, None, "no measured metric (every column from ttft_mean_ms to output_tok_s is "
                                            "empty)")]
    for change, column, problem in cases:
        with pytest.raises(MeasuredRowError) as exc:
            build_row({**BASE, **change}, error=_err)
        assert (exc.value.column, exc.value.detail) == (column, problem)
    burst = build_row({**BASE, "arrival": "burst", "rate_rps": None}, error=_err)
    assert burst.rate_rps is None  # all sent at once: no rate


def test_error_is_an_input_error_with_one_line():
    e = MeasuredRowError("m.csv", "'two' is not an integer", row=3, id="exp-a", stage="1", column="tp")
    assert isinstance(e, InputError)
    assert str(e) == "m.csv: row 3 (id=exp-a, stage=1), column tp: 'two' is not an integer"
    assert str(MeasuredRowError("raw.json", "no rate", id=None, stage=None)) == "raw.json: (id=?, stage=?): no rate"


def test_misspelt_columns_are_told_from_new_ones():
    assert close_column("ttft_mean") == "ttft_mean_ms"
    assert close_column("TTFT Mean (ms)") == "ttft_mean_ms"
    assert close_column("ouput_tokens") == "output_tokens"
    assert close_column("notes") is None and close_column("prompt_tokens_min") is None


# ---------------------------------------------------------------------------------------------- round trip
_TEXT = st.text(alphabet=st.characters(blacklist_categories=("Cs", "Cc")), min_size=1, max_size=12).map(
    str.strip).filter(bool)


def _value(col):
    if col.kind is str:
        return st.sampled_from(col.choices) if col.choices else _TEXT
    if col.kind is bool:
        return st.booleans()
    low = col.low if col.low is not None else 0
    if col.kind is int:
        return st.integers(min_value=int(low) + (1 if col.open_low else 0), max_value=10 ** 7)
    high = col.high if col.high is not None else 1e7
    return st.floats(min_value=low, max_value=high, exclude_min=col.open_low, allow_nan=False, allow_infinity=False)


@st.composite
def rows(draw, index):
    values = {}
    for col in COLUMNS:
        v = draw(_value(col))
        values[col.name] = v if col.required or draw(st.booleans()) else None
    values["id"], values["stage"] = f"exp-{index}", index
    values["ttft_mean_ms"] = values["ttft_mean_ms"] or 1.0
    changed = True
    while changed:  # raise the higher of each ordered pair until every pair holds
        changed = False
        for low, high in ORDERED:
            if values[low] is not None and values[high] is not None and values[high] < values[low]:
                values[high], changed = values[low], True
    if values["prompt_tokens_mean"] is not None and values["prompt_tokens_max"] is not None:
        values["prompt_tokens_max"] = max(values["prompt_tokens_max"], int(values["prompt_tokens_mean"]) + 1)
    extra = draw(st.lists(st.tuples(st.sampled_from(["notes", "operator", "run_url"]),
                                    st.text(alphabet=st.characters(blacklist_categories=("Cs",),
                                                                   blacklist_characters="\x00"), max_size=8)),
                          unique_by=lambda t: t[0], max_size=2))
    return build_row(values, extra, error=_err)


@st.composite
def tables(draw):
    n = draw(st.integers(min_value=1, max_value=4))
    out = [draw(rows(k)) for k in range(n)]
    names = sorted({name for r in out for name, _ in r.extra})
    # a written file has every extra column on every row (empty where a row had none)
    return [dataclasses.replace(r, extra=tuple((name, dict(r.extra).get(name, "")) for name in names)) for r in out]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                  HealthCheck.too_slow])
@given(tables(), st.sampled_from(["m.csv", "m.parquet"]))
def test_write_then_read_gives_the_same_rows(tmp_path, table, name):
    path = write_measured(table, tmp_path / name)
    back = read_measured(path)
    assert back.rows == table
    assert back.extra_columns == tuple(name for name, _ in table[0].extra)


def test_metric_columns_are_the_tail_of_the_schema():
    assert METRIC_COLUMNS[0] == "ttft_mean_ms" and METRIC_COLUMNS[-1] == "output_tok_s"
    assert all(BY_NAME[c].kind is float for c in METRIC_COLUMNS)
    assert isinstance(build_row(BASE, error=_err), MeasuredRow)
