"""One message as one Kinesis record: its data and its partition key, sized as Kinesis counts them."""

from __future__ import annotations

import hashlib
import json

#: The largest record: data plus partition key, bytes ("Quotas and limits", 1 MiB).
MAX_RECORD_BYTES = 1024 * 1024
#: ``PutRecords``: at most 500 records and 5 MiB (data plus partition keys) per call.
RECORDS_PER_CALL = 500
BYTES_PER_CALL = 5 * 1024 * 1024
#: A partition key is 1-256 Unicode characters ("PutRecordsRequestEntry", PartitionKey).
MAX_PARTITION_KEY_CHARS = 256


def partition_key(key: str | None, message_id: str) -> str:
    """The ordering key (one shard keeps its order; a digest when too long), else the message id."""
    if key is None:
        return message_id
    if len(key) <= MAX_PARTITION_KEY_CHARS:
        return key
    return "sha256-" + hashlib.sha256(key.encode("utf-8")).hexdigest()


def record_data(message_id: str, type_: str, key: str | None, headers_json: str | None, payload_json: str) -> str:
    """A JSON object of the message id, type, key, headers and payload; the stored JSON goes in unchanged."""
    parts = [f'{{"id":"{message_id}","type":{json.dumps(type_, ensure_ascii=False)}']
    if key is not None:
        parts.append(f'"key":{json.dumps(key, ensure_ascii=False)}')
    if headers_json:
        parts.append(f'"headers":{headers_json}')
    parts.append(f'"payload":{payload_json}}}')
    return ",".join(parts)


def record_bytes(data: str, partition: str) -> int:
    """What the record counts towards the 1 MiB and 5 MiB limits."""
    return len(data.encode("utf-8")) + len(partition.encode("utf-8"))
