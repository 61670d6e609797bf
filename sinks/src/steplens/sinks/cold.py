"""Cold layout: records to Parquet rows and Hive-style object keys (pure; no S3 here).

Key: ``<prefix>/kind=<kind>/run_id=<run>/hour=<YYYY-MM-DDTHH>/<topic>-p<P>-o<first>-<last>.parquet``
with the run id percent-encoded (pyarrow's and Spark's Hive partitioning decode it).
One row per record: the envelope, the kind's fields (maps flattened to ``<field>.<key>``,
lists and objects as JSON text), the Kafka position, and ``payload``: the record's exact wire
bytes, so replay re-sends what was produced. A ``step_batch`` message is stored as the step
records it stands for (``schema.unbatch``): one ``kind=step`` row each, all at the message's
offset, each with that step record's wire bytes (``schema.encode``) as ``payload``.
"""

from __future__ import annotations

import io
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Final
from urllib.parse import quote, unquote

import pyarrow as pa
import pyarrow.parquet as pq

from steplens import schema
from steplens.schema import Record

ENVELOPE_COLUMNS: Final = [
    pa.field("v", pa.int32()),
    pa.field("kind", pa.string()),
    pa.field("run_id", pa.string()),
    pa.field("rank", pa.int64()),
    pa.field("local_rank", pa.int64()),
    pa.field("host", pa.string()),
    pa.field("pid", pa.int64()),
    pa.field("seq", pa.int64()),
    pa.field("time_ns", pa.int64()),
    pa.field("time", pa.timestamp("ns", tz="UTC")),
    pa.field("step", pa.int64()),
]
SOURCE_COLUMNS: Final = [
    pa.field("kafka_topic", pa.string()),
    pa.field("kafka_partition", pa.int32()),
    pa.field("kafka_offset", pa.int64()),
    pa.field("payload", pa.binary()),
]
# a payload field's column by the type of its decoded value; a map of numbers is flattened
_ARROW_TYPE: Final = {float: pa.float64(), int: pa.int64(), str: pa.string(), bool: pa.bool_()}


@dataclass(frozen=True)
class GroupKey:
    """Records that share one object: same kind, run and UTC hour."""

    kind: str
    run_id: str
    hour: str


def hour_of(time_ns: int) -> str:
    return datetime.fromtimestamp(time_ns / 1e9, tz=timezone.utc).strftime("%Y-%m-%dT%H")


def group_of(rec: Record) -> GroupKey:
    return GroupKey(rec.kind, rec.run_id, hour_of(rec.time_ns))


def run_prefix(prefix: str, kind: str, run_id: str) -> str:
    head = f"{prefix.strip('/')}/" if prefix.strip("/") else ""
    return f"{head}kind={quote(kind, safe='')}/run_id={quote(run_id, safe='')}/"


def object_key(
    prefix: str, group: GroupKey, topic: str, partition: int, *, first: int, last: int
) -> str:
    return (
        f"{run_prefix(prefix, group.kind, group.run_id)}hour={group.hour}/"
        f"{quote(topic, safe='.')}-p{partition}-o{first}-{last}.parquet"
    )


def hour_from_key(key: str) -> str | None:
    for part in key.split("/"):
        if part.startswith("hour="):
            return unquote(part[5:])
    return None


def record_row(rec: Record, topic: str, partition: int, offset: int, payload: bytes) -> dict:
    row: dict[str, Any] = {
        "v": rec.v,
        "kind": rec.kind,
        "run_id": rec.run_id,
        "rank": rec.rank,
        "local_rank": rec.local_rank,
        "host": rec.host,
        "pid": rec.pid,
        "seq": rec.seq,
        "time_ns": rec.time_ns,
        "time": rec.time_ns,
        "step": rec.step,
        "kafka_topic": topic,
        "kafka_partition": partition,
        "kafka_offset": offset,
        "payload": payload,
    }
    shapes = schema.payload_fields(rec.kind)
    for name, value in rec.data.items():
        shape = shapes[name]
        if shape.python in _ARROW_TYPE:
            row[name] = value
        elif shape.numbers is not None:
            for key, item in value.items():
                row[f"{name}.{key}"] = item
        else:
            row[name] = schema.wire_json(value)
    return row


def arrow_schema(kind: str, rows: Iterable[dict]) -> pa.Schema:
    """Fixed columns for the kind, then the flattened map columns seen in ``rows``."""
    fields = list(ENVELOPE_COLUMNS)
    maps: dict[str, pa.DataType] = {}
    for name, shape in schema.payload_fields(kind).items():
        if shape.numbers is not None:
            maps[name] = _ARROW_TYPE[shape.numbers]
        else:
            fields.append(pa.field(name, _ARROW_TYPE.get(shape.python, pa.string())))
    fixed = {f.name for f in fields} | {f.name for f in SOURCE_COLUMNS}
    dynamic: dict[str, pa.DataType] = {}
    for row in rows:
        for col in row:
            if col not in fixed and col not in dynamic:
                dynamic[col] = maps.get(col.split(".", 1)[0], pa.float64())
    fields += [pa.field(n, t) for n, t in sorted(dynamic.items())]
    return pa.schema(fields + list(SOURCE_COLUMNS))


def rows_to_parquet(kind: str, rows: list[dict], compression: str = "zstd") -> bytes:
    table = pa.Table.from_pylist(rows, schema=arrow_schema(kind, rows))
    sink = io.BytesIO()
    pq.write_table(table, sink, compression=compression)
    return sink.getvalue()


def read_parquet(data: bytes, columns: list[str] | None = None) -> pa.Table:
    f = pq.ParquetFile(io.BytesIO(data))
    if columns is not None:
        present = set(f.schema_arrow.names)
        columns = [c for c in columns if c in present]
    return f.read(columns=columns)
