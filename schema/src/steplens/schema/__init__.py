"""The wire contract of steplens, version 1: the declared record kinds and their one codec.

``kinds`` declares every record kind as a msgspec Struct (the envelope, each kind's payload, a
step_batch entry) and the tagged union on ``kind`` the codec decodes; ``codec`` encodes, decodes
and validates records; ``record`` is what consumers receive (``Record``, ``DecodeError``);
``fields`` answers what the declared types say about each payload field. ``topics``,
``settings`` and ``dead_letter`` are what every part shares about the wire; ``kafka_config`` and
``kafka_produce`` about its clients; ``store_layout`` the names of the InfluxDB store. This face
re-exports what callers use: ``from steplens import schema; schema.decode(raw)``.
"""

from steplens.schema import kinds
from steplens.schema.codec import (
    decode,
    encode,
    make_record,
    restore,
    restore_fields,
    unbatch,
    validate,
    wire_json,
    wire_value,
)
from steplens.schema.fields import FieldShape, payload_fields
from steplens.schema.kinds import (
    ALERT_STATES,
    KINDS,
    MAX_BATCH_ENTRIES,
    MAX_LIST_LEN,
    MAX_NAME_LEN,
    MAX_RECORD_BYTES,
    MAX_STR_LEN,
    NAME_PATTERN,
    RUN_RANK,
    SCHEMA_VERSION,
    SEVERITIES,
    THROTTLE_REASONS,
    WireRecord,
)
from steplens.schema.metric_names import valid_name
from steplens.schema.record import DecodeError, Record, SchemaError, record_key

STEP_ENTRY = kinds.StepEntry  # one entry of a step_batch (a Struct)

__all__ = [
    "ALERT_STATES",
    "KINDS",
    "MAX_BATCH_ENTRIES",
    "MAX_LIST_LEN",
    "MAX_NAME_LEN",
    "MAX_RECORD_BYTES",
    "MAX_STR_LEN",
    "NAME_PATTERN",
    "RUN_RANK",
    "SCHEMA_VERSION",
    "SEVERITIES",
    "STEP_ENTRY",
    "THROTTLE_REASONS",
    "DecodeError",
    "FieldShape",
    "Record",
    "SchemaError",
    "WireRecord",
    "decode",
    "encode",
    "make_record",
    "payload_fields",
    "record_key",
    "restore",
    "restore_fields",
    "unbatch",
    "valid_name",
    "validate",
    "wire_json",
    "wire_value",
]
