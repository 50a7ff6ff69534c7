"""JSONL run records (protocol/records.py): the one reader and writer of every *.jsonl a run keeps."""
from __future__ import annotations

import json

from protocol.records import RecordWriter, read_records


def test_a_torn_last_line_is_skipped_on_reading_and_cut_before_the_next_append(tmp_path):
    path = tmp_path / "results.jsonl"
    path.write_text(json.dumps({"a": 1}) + "\n" + '{"a": 2, "b"')  # a run killed mid-write
    assert read_records(path) == [{"a": 1}]
    with RecordWriter(path) as records:
        records.write({"a": 3})
    assert path.read_text() == '{"a": 1}\n{"a": 3}\n', "the torn line would have glued onto the new record"
    assert read_records(path) == [{"a": 1}, {"a": 3}]


def test_a_missing_file_reads_as_no_records_and_blank_lines_are_not_records(tmp_path):
    assert read_records(tmp_path / "none.jsonl") == []
    path = tmp_path / "gaps.jsonl"
    path.write_text('{"a": 1}\n\n{"a": 2}\n')
    assert read_records(path) == [{"a": 1}, {"a": 2}]


def test_each_record_is_on_disk_as_soon_as_it_is_written(tmp_path):
    path = tmp_path / "episodes.jsonl"
    records = RecordWriter(path)
    records.write({"step": 1})
    assert read_records(path) == [{"step": 1}], "a crash after write() must not lose the record"
    records.close()
