from __future__ import annotations

import csv
import gzip
from datetime import datetime
from pathlib import Path

import pytest

from gpupool.sim.trace import TraceError, TraceJob, load_trace

HEADER = "job_id,submit_time,submit_datetime,num_gpus,duration,vc,user,status\n"
ROWS = (
    "j0,0,2017-10-01 00:00:00,8,100,vcA,,\n"
    "j1,30,2017-10-01 00:00:30,1.0,50.5,,,Pass\n"
    "j2,10,2017-10-01 00:00:10,0,5,vcB,,\n"
    "j3,10,2017-10-01 00:00:10,2,7,vcB,,\n"
)


def write(path: Path, text: str) -> Path:
    if path.suffix == ".gz":
        with gzip.open(path, "wt", encoding="utf-8", newline="") as stream:
            stream.write(text)
    else:
        path.write_text(text, encoding="utf-8", newline="")
    return path


def test_a_good_file_loads_sorted_by_submit_time_with_ties_in_file_order(tmp_path: Path) -> None:
    trace = load_trace(write(tmp_path / "jobs.csv", HEADER + ROWS))
    assert [job.job_id for job in trace.jobs] == ["j0", "j3", "j1"]
    assert trace.jobs[0] == TraceJob("j0", 0.0, 8, 100.0, "vcA", datetime(2017, 10, 1))
    assert trace.jobs[2] == TraceJob("j1", 30.0, 1, 50.5, "default", datetime(2017, 10, 1, 0, 0, 30))
    assert trace.zero_gpu_jobs == 1
    assert trace.outside_window == 0
    assert trace.path == tmp_path / "jobs.csv"


def test_ties_keep_file_order_even_when_the_file_is_not_sorted(tmp_path: Path) -> None:
    text = "job_id,submit_time,num_gpus,duration,vc\nb,5,1,1,\na,5,1,1,\nc,1,1,1,\nd,5,1,1,\n"
    trace = load_trace(write(tmp_path / "jobs.csv", text))
    assert [job.job_id for job in trace.jobs] == ["c", "b", "a", "d"]


def test_submit_times_are_kept_as_in_the_file_not_rebased(tmp_path: Path) -> None:
    text = "job_id,submit_time,num_gpus,duration,vc\na,500,1,1,\nb,700.25,1,1,\n"
    trace = load_trace(write(tmp_path / "jobs.csv", text))
    assert [job.submit_time for job in trace.jobs] == [500.0, 700.25]


def test_a_gzip_file_loads_like_the_plain_one(tmp_path: Path) -> None:
    plain = load_trace(write(tmp_path / "jobs.csv", HEADER + ROWS))
    zipped = load_trace(write(tmp_path / "jobs.csv.gz", HEADER + ROWS))
    assert zipped.jobs == plain.jobs
    assert zipped.zero_gpu_jobs == plain.zero_gpu_jobs


def test_only_the_required_columns_are_needed_and_then_there_is_no_datetime(tmp_path: Path) -> None:
    trace = load_trace(write(tmp_path / "jobs.csv", "vc,duration,num_gpus,submit_time,job_id\nv,3,2,1,x\n"))
    assert trace.jobs == (TraceJob("x", 1.0, 2, 3.0, "v", None),)


def test_blank_lines_are_skipped_and_later_line_numbers_stay_physical(tmp_path: Path) -> None:
    text = "job_id,submit_time,num_gpus,duration,vc\n\na,1,1,1,\n\nb,1,x,1,\n"
    with pytest.raises(TraceError) as caught:
        load_trace(write(tmp_path / "jobs.csv", text))
    assert caught.value.line == 5


def test_a_window_keeps_jobs_submitted_from_start_up_to_but_not_including_end(tmp_path: Path) -> None:
    trace = load_trace(
        write(tmp_path / "jobs.csv", HEADER + ROWS),
        start=datetime(2017, 10, 1, 0, 0, 10),
        end=datetime(2017, 10, 1, 0, 0, 30),
    )
    assert [job.job_id for job in trace.jobs] == ["j3"]
    assert trace.outside_window == 2
    assert trace.zero_gpu_jobs == 1


def test_a_window_may_be_open_on_one_side(tmp_path: Path) -> None:
    path = write(tmp_path / "jobs.csv", HEADER + ROWS)
    assert [job.job_id for job in load_trace(path, start=datetime(2017, 10, 1, 0, 0, 10)).jobs] == [
        "j3",
        "j1",
    ]
    assert [job.job_id for job in load_trace(path, end=datetime(2017, 10, 1, 0, 0, 10)).jobs] == ["j0"]


def test_a_window_on_a_trace_without_submit_datetime_names_the_file(tmp_path: Path) -> None:
    path = write(tmp_path / "jobs.csv", "job_id,submit_time,num_gpus,duration,vc\na,1,1,1,\n")
    with pytest.raises(TraceError, match="no submit_datetime column") as caught:
        load_trace(path, start=datetime(2017, 1, 1))
    assert str(caught.value).startswith(f"{path}: ")


@pytest.mark.parametrize(
    ("start", "end"),
    [
        (datetime(2017, 2, 1), datetime(2017, 1, 1)),
        (datetime(2017, 1, 1), datetime(2017, 1, 1)),
        (datetime.fromisoformat("2017-01-01T00:00:00+00:00"), None),
    ],
)
def test_an_empty_or_timezone_aware_window_is_refused(tmp_path: Path, start: datetime, end: datetime | None) -> None:
    with pytest.raises(ValueError, match="window"):
        load_trace(write(tmp_path / "jobs.csv", HEADER + ROWS), start=start, end=end)


def test_a_missing_file_says_so(tmp_path: Path) -> None:
    path = tmp_path / "nope.csv"
    with pytest.raises(TraceError) as caught:
        load_trace(path)
    assert str(caught.value) == f"{path}: no such file"
    assert (caught.value.path, caught.value.line, caught.value.column) == (path, None, None)


def test_missing_columns_are_listed_in_schema_order(tmp_path: Path) -> None:
    path = write(tmp_path / "jobs.csv", "num_gpus,job_id,submit_time\n1,a,0\n")
    with pytest.raises(TraceError) as caught:
        load_trace(path)
    assert str(caught.value) == f"{path}: missing column(s) duration, vc"


@pytest.mark.parametrize(
    ("text", "detail"),
    [
        ("", "empty file, no header"),
        ("job_id,job_id,submit_time,num_gpus,duration,vc\n", "duplicate column(s) job_id"),
    ],
)
def test_a_bad_header_is_an_error_on_line_one(tmp_path: Path, text: str, detail: str) -> None:
    path = write(tmp_path / "jobs.csv", text)
    with pytest.raises(TraceError) as caught:
        load_trace(path)
    assert str(caught.value) == f"{path} line 1: {detail}"


def test_a_file_that_is_not_gzip_despite_its_suffix_is_a_trace_error(tmp_path: Path) -> None:
    path = write(tmp_path / "jobs.csv", HEADER + ROWS).rename(tmp_path / "jobs.csv.gz")
    with pytest.raises(TraceError, match="unreadable"):
        load_trace(path)


def test_the_error_message_reads_file_line_column_and_value(tmp_path: Path) -> None:
    rows = "".join(f"j{i},{i},1,1,v\n" for i in range(2, 812))
    path = write(tmp_path / "jobs.csv", "job_id,submit_time,num_gpus,duration,vc\n" + rows + "bad,1,-1,1,v\n")
    with pytest.raises(TraceError) as caught:
        load_trace(path)
    assert str(caught.value) == f"{path} line 812, column num_gpus: '-1' is not a positive integer"
    assert (caught.value.line, caught.value.column) == (812, "num_gpus")


@pytest.mark.parametrize(
    ("column", "value", "detail"),
    [
        ("job_id", "", "empty"),
        ("job_id", "  ", "empty"),
        ("job_id", "first", "job_id 'first' already used on line 2"),
        ("submit_time", "x", "'x' is not a number ≥ 0"),
        ("submit_time", "-1", "'-1' is not a number ≥ 0"),
        ("submit_time", "nan", "'nan' is not a number ≥ 0"),
        ("submit_time", "inf", "'inf' is not a number ≥ 0"),
        ("submit_time", "", "'' is not a number ≥ 0"),
        ("num_gpus", "8.5", "'8.5' is not a positive integer"),
        ("num_gpus", "-1", "'-1' is not a positive integer"),
        ("num_gpus", "x", "'x' is not a positive integer"),
        ("num_gpus", "", "'' is not a positive integer"),
        ("num_gpus", "inf", "'inf' is not a positive integer"),
        ("duration", "-0.5", "'-0.5' is not a number ≥ 0"),
        ("duration", "nan", "'nan' is not a number ≥ 0"),
        ("submit_datetime", "2017-10-01T00:00:00", "'2017-10-01T00:00:00' is not a YYYY-MM-DD HH:MM:SS time"),
        ("submit_datetime", "2017-13-01 00:00:00", "'2017-13-01 00:00:00' is not a YYYY-MM-DD HH:MM:SS time"),
        ("submit_datetime", "2017-10-01", "'2017-10-01' is not a YYYY-MM-DD HH:MM:SS time"),
    ],
)
def test_a_bad_value_is_reported_with_its_line_and_column(tmp_path: Path, column: str, value: str, detail: str) -> None:
    fields = {"job_id": "second", "submit_time": "1", "submit_datetime": "", "num_gpus": "1", "duration": "1"}
    fields[column] = value
    row = ",".join([fields["job_id"], fields["submit_time"], fields["submit_datetime"]])
    row += f",{fields['num_gpus']},{fields['duration']},v,,\n"
    path = write(tmp_path / "jobs.csv", HEADER + "first,0,,1,1,v,,\n" + row)
    with pytest.raises(TraceError) as caught:
        load_trace(path)
    assert str(caught.value) == f"{path} line 3, column {column}: {detail}"
    assert (caught.value.path, caught.value.line, caught.value.column) == (path, 3, column)


@pytest.mark.parametrize(("value", "gpus"), [("8", 8), ("8.0", 8), (" 4 ", 4)])
def test_integral_gpu_counts_are_accepted_in_either_spelling(tmp_path: Path, value: str, gpus: int) -> None:
    path = write(tmp_path / "jobs.csv", f"job_id,submit_time,num_gpus,duration,vc\na,0,{value},1,v\n")
    assert load_trace(path).jobs[0].gpus == gpus


def test_rows_are_validated_even_when_a_window_would_drop_them(tmp_path: Path) -> None:
    path = write(tmp_path / "jobs.csv", HEADER + "a,0,2016-01-01 00:00:00,x,1,v,,\n")
    with pytest.raises(TraceError, match="num_gpus"):
        load_trace(path, start=datetime(2017, 1, 1))


def test_an_empty_submit_datetime_is_fine_without_a_window_and_an_error_with_one(tmp_path: Path) -> None:
    path = write(tmp_path / "jobs.csv", HEADER + "a,0,,1,1,v,,\n")
    assert load_trace(path).jobs[0].submit_datetime is None
    with pytest.raises(TraceError) as caught:
        load_trace(path, end=datetime(2017, 1, 1))
    assert (caught.value.line, caught.value.column) == (2, "submit_datetime")


@pytest.mark.parametrize("row", ["a,0,,1,1,v,,,\n", "a,0,,1,1,v\n", "a\n"])
def test_a_row_with_the_wrong_number_of_fields_is_an_error_with_its_line(tmp_path: Path, row: str) -> None:
    path = write(tmp_path / "jobs.csv", HEADER + "ok,0,,1,1,v,,\n" + row)
    with pytest.raises(TraceError, match=r"field\(s\), the header has 8") as caught:
        load_trace(path)
    assert caught.value.line == 3
    assert caught.value.column is None


def test_zero_gpu_rows_are_counted_not_loaded(tmp_path: Path) -> None:
    text = "job_id,submit_time,num_gpus,duration,vc\na,0,0,1,\nb,0,0.0,1,\nc,0,1,1,\n"
    trace = load_trace(write(tmp_path / "jobs.csv", text))
    assert [job.job_id for job in trace.jobs] == ["c"]
    assert trace.zero_gpu_jobs == 2


def test_philly_loads_in_full_with_its_published_statistics(traces_dir: Path) -> None:
    trace = load_trace(traces_dir / "philly" / "jobs.csv")
    assert len(trace.jobs) == 82_247
    assert len({job.team for job in trace.jobs}) == 15
    gpu_hours = sum(job.gpus * job.duration for job in trace.jobs) / 3600
    assert gpu_hours == pytest.approx(978_078, abs=1)
    assert trace.zero_gpu_jobs == 0
    assert trace.jobs[0].submit_datetime == datetime(2017, 9, 4, 10, 30, 41)


def test_alibaba_pods_never_scheduled_are_skipped_and_counted(traces_dir: Path) -> None:
    trace = load_trace(traces_dir / "alibaba-openb-2023" / "jobs.csv")
    assert trace.no_duration == 897
    assert trace.zero_gpu_jobs > 0
    assert all(job.gpus > 0 and job.duration >= 0 for job in trace.jobs)


def test_a_window_on_philly_keeps_exactly_the_rows_submitted_in_it(traces_dir: Path) -> None:
    path = traces_dir / "philly" / "jobs.csv"
    start, end = datetime(2017, 10, 1), datetime(2017, 12, 1)
    with path.open(newline="") as stream:
        stamps = [row["submit_datetime"] for row in csv.DictReader(stream)]
    # The fixed-width format sorts as text, so this count does not lean on the loader's parsing.
    inside = sum("2017-10-01 00:00:00" <= stamp < "2017-12-01 00:00:00" for stamp in stamps)
    trace = load_trace(path, start=start, end=end)
    assert len(trace.jobs) == inside
    assert trace.outside_window == len(stamps) - inside
    assert all(job.submit_datetime is not None and start <= job.submit_datetime < end for job in trace.jobs)
