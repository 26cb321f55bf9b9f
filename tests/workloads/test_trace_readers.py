"""Trace readers: every format from small files, detection, mappings, row errors."""

from __future__ import annotations

import json

import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lbbench.workloads import TraceError
from lbbench.workloads.traces import (CANONICAL_SCHEMA, load_trace_requests, read_trace, trace_to_requests,
                                      write_canonical)

AZURE = ("TIMESTAMP,ContextTokens,GeneratedTokens\n"
         "2023-11-16 18:15:46.6805900,374,44\n"
         "2023-11-16 18:15:50.9951690,396,109\n"
         "2023-11-16 18:15:51.2224670,879,55")  # no final newline, like the real files

BURSTGPT = ("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
            "5,ChatGPT,472,18,490,Conversation log\n"
            "45,ChatGPT,1087,0,1087,Conversation log\n"
            "118,GPT-4,417,276,693,API log\n")


def write(tmp_path, name, text):
    p = tmp_path / name
    p.write_text(text)
    return p


def test_azure_csv(tmp_path):
    tf = read_trace(write(tmp_path, "conv.csv", AZURE))
    assert tf.format == "azure"
    df = tf.frame
    assert df.columns == list(CANONICAL_SCHEMA)
    assert df.get_column("arrival_s").to_list() == pytest.approx([0.0, 4.314579, 4.541877], abs=1e-9)
    assert df.get_column("prompt_tokens").to_list() == [374, 396, 879]
    assert df.get_column("output_tokens").to_list() == [44, 109, 55]
    assert not df.get_column("failed").any()


def test_azure_2024_timezone_suffix(tmp_path):
    text = ("TIMESTAMP,ContextTokens,GeneratedTokens\n"
            "2024-05-10 00:00:00.009930+00:00,4808,10\n"
            "2024-05-10 00:00:01.5+00:00,3180,8\n")
    tf = read_trace(write(tmp_path, "code_1week.csv", text))
    assert tf.frame.get_column("arrival_s").to_list() == pytest.approx([0.0, 1.49007])


def test_burstgpt_failures_and_task(tmp_path):
    path = write(tmp_path, "BurstGPT_1.csv", BURSTGPT)
    tf = read_trace(path)
    assert tf.format == "burstgpt"
    df = tf.frame
    assert df.get_column("arrival_s").to_list() == [0.0, 40.0, 113.0]
    assert df.get_column("failed").to_list() == [False, True, False]
    assert df.get_column("task").to_list() == ["ChatGPT", "ChatGPT", "GPT-4"]
    by_log = read_trace(path, mapping="task=Log Type").frame
    assert by_log.get_column("task").to_list() == ["Conversation log", "Conversation log", "API log"]
    reqs = load_trace_requests(path)
    assert [(r.request_id, r.prompt_tokens, r.output_tokens) for r in reqs] == [(0, 472, 18), (1, 417, 276)]


def test_mooncake_jsonl(tmp_path):
    lines = [{"timestamp": 0, "input_length": 1000, "output_length": 6, "hash_ids": [0, 1]},
             {"timestamp": 1500, "input_length": 600, "output_length": 20, "hash_ids": [0, 2]},
             {"timestamp": 2250, "input_length": 13, "output_length": 1, "hash_ids": [3]}]
    path = write(tmp_path, "trace.jsonl", "\n".join(json.dumps(x) for x in lines) + "\n")
    tf = read_trace(path)
    assert tf.format == "mooncake" and tf.block_tokens == 512
    assert tf.frame.get_column("arrival_s").to_list() == [0.0, 1.5, 2.25]
    reqs = trace_to_requests(tf)
    assert reqs[1].prefix_hashes == (0, 2)
    assert reqs[2].prompt_tokens == 13


@pytest.mark.parametrize("suffix", ["csv", "jsonl", "parquet"])
def test_canonical_formats(tmp_path, suffix):
    df = pl.DataFrame({"arrival_s": [0.5, 0.0, 2.0], "prompt_tokens": [10, 20, 30],
                       "output_tokens": [1, 2, 3], "task": ["a", None, "c"]})
    path = tmp_path / f"t.{suffix}"
    getattr(df, {"csv": "write_csv", "jsonl": "write_ndjson", "parquet": "write_parquet"}[suffix])(path)
    tf = read_trace(path)
    assert tf.format == "canonical"
    out = tf.frame
    # sorted by arrival, re-zeroed at the first
    assert out.get_column("arrival_s").to_list() == [0.0, 0.5, 2.0]
    assert out.get_column("prompt_tokens").to_list() == [20, 10, 30]
    assert out.get_column("task").to_list() == [None, "a", "c"]


def test_mapped_csv_with_unit(tmp_path):
    text = "ts_ms,model,in,out\n1000,x,5,7\n3500,y,6,8\n"
    path = write(tmp_path, "custom.csv", text)
    with pytest.raises(TraceError, match="give a mapping arrival=COL"):
        read_trace(path)
    tf = read_trace(path, mapping="arrival=ts_ms,prompt=in,output=out,task=model,unit=ms")
    assert tf.format == "mapped"
    assert tf.frame.get_column("arrival_s").to_list() == [0.0, 2.5]
    assert tf.frame.get_column("task").to_list() == ["x", "y"]


def test_mapped_datetime_detected_without_unit(tmp_path):
    text = "when,p,o\n2024-01-01T10:00:00Z,5,7\n2024-01-01T10:00:02.25Z,6,8\n"
    tf = read_trace(write(tmp_path, "d.csv", text), mapping="arrival=when,prompt=p,output=o")
    assert tf.frame.get_column("arrival_s").to_list() == [0.0, 2.25]


def test_mapping_naming_a_missing_column(tmp_path):
    path = write(tmp_path, "custom.csv", "a,b,c\n1,2,3\n")
    with pytest.raises(TraceError, match=r"no column 'zz' for output"):
        read_trace(path, mapping="arrival=a,prompt=b,output=zz")


@pytest.mark.parametrize("bad, what", [
    ("abc", "ContextTokens is not a number ('abc')"),
    ("-4", "ContextTokens is negative"),
    ("", "ContextTokens is missing"),
    ("12.5", "ContextTokens is not a whole number"),
])
def test_bad_row_names_file_row_and_column(tmp_path, bad, what):
    lines = AZURE.split("\n")
    lines[2] = f"2023-11-16 18:15:50.9951690,{bad},109"
    path = write(tmp_path, "conv.csv", "\n".join(lines))
    with pytest.raises(TraceError) as err:
        read_trace(path)
    assert str(err.value).startswith(f"{path}: row 2: ")
    assert what in str(err.value)
    tf = read_trace(path, skip_bad_rows=True)
    assert tf.skipped_rows == 1 and len(tf) == 2


def test_bad_timestamp(tmp_path):
    path = write(tmp_path, "conv.csv", AZURE.replace("2023-11-16 18:15:51.2224670", "yesterday"))
    with pytest.raises(TraceError, match=r"row 3: TIMESTAMP is not a date-time \('yesterday'\)"):
        read_trace(path)


def test_jsonl_broken_line(tmp_path):
    text = ('{"timestamp": 0, "input_length": 5, "output_length": 6, "hash_ids": [1]}\n'
            '{"timestamp": 10, "input_length": 5, "output_len\n'
            '{"timestamp": 20, "input_length": "x", "output_length": 6, "hash_ids": [2]}\n'
            '{"timestamp": 30, "input_length": 7, "output_length": 6, "hash_ids": [3]}\n')
    path = write(tmp_path, "m.jsonl", text)
    with pytest.raises(TraceError, match=r"m.jsonl: row 2: not a JSON object"):
        read_trace(path)
    tf = read_trace(path, skip_bad_rows=True)
    assert tf.skipped_rows == 2
    assert tf.frame.get_column("prompt_tokens").to_list() == [5, 7]


def test_jsonl_wrong_type_names_row(tmp_path):
    text = ('{"timestamp": 0, "input_length": 5, "output_length": 6}\n'
            '{"timestamp": 20, "input_length": "many", "output_length": 6}\n')
    with pytest.raises(TraceError, match=r"row 2: input_length is not a number"):
        read_trace(write(tmp_path, "m.jsonl", text))


def test_empty_and_unknown_files(tmp_path):
    with pytest.raises(TraceError, match="empty"):
        read_trace(write(tmp_path, "e.csv", ""))
    with pytest.raises(TraceError, match="no such file"):
        read_trace(tmp_path / "missing.csv")
    with pytest.raises(TraceError, match="unknown format"):
        read_trace(write(tmp_path, "a.csv", AZURE), fmt="splitwise")


def test_explicit_format_must_fit(tmp_path):
    with pytest.raises(TraceError, match="no column 'Timestamp'"):
        read_trace(write(tmp_path, "conv.csv", AZURE), fmt="burstgpt")


def test_zero_lengths_are_marked_failed(tmp_path):
    text = "arrival_s,prompt_tokens,output_tokens\n0,0,5\n1,5,0\n2,5,5\n"
    tf = read_trace(write(tmp_path, "c.csv", text))
    assert tf.frame.get_column("failed").to_list() == [True, True, False]
    assert len(trace_to_requests(tf)) == 1


def test_load_with_nothing_left_is_an_error(tmp_path):
    path = write(tmp_path, "conv.csv", AZURE)
    with pytest.raises(TraceError, match="no requests left"):
        load_trace_requests(path, max_prompt_tokens=10)


rows = st.lists(st.tuples(st.floats(0, 1e6, allow_nan=False), st.integers(0, 10**6), st.integers(0, 10**5),
                          st.one_of(st.none(), st.sampled_from(["chat", "code"])),
                          st.one_of(st.none(), st.lists(st.integers(0, 2**40), max_size=5)),
                          st.booleans()), min_size=1, max_size=40)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=rows)
def test_canonical_parquet_round_trip(tmp_path, data):
    t0 = min(r[0] for r in data)
    df = pl.DataFrame([(t - t0, p, o, task, h, f) for t, p, o, task, h, f in data],
                      schema=CANONICAL_SCHEMA, orient="row").sort("arrival_s", maintain_order=True)
    path = tmp_path / "rt.parquet"
    write_canonical(df, path)
    back = read_trace(path).frame
    expect = df.with_columns(pl.col("failed") | (pl.col("prompt_tokens") == 0) | (pl.col("output_tokens") == 0))
    assert back.equals(expect)
    reqs = trace_to_requests(back)
    assert [r.request_id for r in reqs] == list(range(len(reqs)))
    assert len(reqs) == int((~expect.get_column("failed")).sum())
    assert all(a.arrival_s <= b.arrival_s for a, b in zip(reqs, reqs[1:]))


def test_crlf_and_padded_header(tmp_path):
    text = ("Timestamp, Model, Request tokens, Response tokens, Total tokens, Log Type\r\n"
            "5, ChatGPT, 472, 18, 490, Conversation log\r\n"
            "45, GPT-4, 1087, 0, 1087, API log\r\n")
    tf = read_trace(write(tmp_path, "b.csv", text))
    assert tf.format == "burstgpt"
    assert tf.frame.get_column("task").to_list() == ["ChatGPT", "GPT-4"]
    assert tf.frame.get_column("failed").to_list() == [False, True]
