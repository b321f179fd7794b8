"""Damage made to order for the data-fault tests: the faults a bad disk, an interrupted copy
or a flaky mount leave, on shards written by the tests themselves."""

from __future__ import annotations

import os

from array_record.python.array_record_module import ArrayRecordReader, ArrayRecordWriter

from jaxspeech.data import records


def read_all(path: str) -> list[bytes]:
    reader = ArrayRecordReader(path)
    out = reader.read_all()
    reader.close()
    return list(out)


def rewrite_uncompressed(path: str) -> list[bytes]:
    """Rewrites a shard with the same records, one per chunk and stored as they are, so a
    record's bytes can be found in the file (and damaged alone). Returns the records."""
    data = read_all(path)
    writer = ArrayRecordWriter(path, "group_size:1,uncompressed")
    for record in data:
        writer.write(record)
    writer.close()
    return data


def flip_record(path: str, record: bytes, n: int = 64) -> None:
    """Inverts `n` bytes just after the JSON header of `record` inside the (uncompressed)
    shard: its chunk's checksum fails, its neighbours' do not. (Riegeli interleaves a
    24-byte block header every 64 KiB, so a long record is not contiguous in the file:
    its start is found by its header, which holds its unique id.)"""
    with open(path, "r+b") as f:
        blob = f.read()
        head = record[:200]
        at = blob.find(head)
        assert at >= 0 and blob.find(head, at + 1) < 0, "record not found once in the shard"
        mid = at + 200
        block = 1 << 16
        assert mid // block == (mid + n) // block and mid % block >= 24, "on a block header"
        f.seek(mid)
        f.write(bytes(b ^ 0xFF for b in blob[mid : mid + n]))


def truncate(path: str, fraction: float = 0.6) -> None:
    """Cuts the file short (an interrupted copy): its footer and index are gone."""
    with open(path, "r+b") as f:
        f.truncate(int(os.path.getsize(path) * fraction))


def undecodable(record: bytes) -> bytes:
    """The same record with its audio cut by one byte: it passes the shard's checksums
    (it is written that way) but does not decode."""
    header = records.decode_header(record)
    assert header["audio_format"] == "pcm_s16le"
    return record[:-1]


def replace_record(path: str, index: int, new: bytes) -> list[bytes]:
    """Rewrites a shard with record `index` replaced by `new`; returns the old records."""
    data = read_all(path)
    writer = ArrayRecordWriter(path, "group_size:1")
    for i, record in enumerate(data):
        writer.write(new if i == index else record)
    writer.close()
    return data
