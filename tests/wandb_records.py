"""What an offline W&B run recorded, read back from its ``.wandb`` file (not a test module: tests
import these instead of importing each other)."""

import time


def read_wandb_records(path):
    """The records of an offline ``.wandb`` file, decoded with wandb's own protobufs. The file is
    wandb's LevelDB-style log: a 7-byte header, then 32 KiB blocks of chunks (crc32 4 bytes,
    length 2, type 1: full, first, middle, last)."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B"
    records, pending, pos, block = [], b"", 7, 32768
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # too little room left in the block for a chunk header: padding
            pos += block - pos % block
            continue
        length = int.from_bytes(data[pos + 4:pos + 6], "little")
        kind = data[pos + 6]
        chunk = data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind == 0 and length == 0:
            continue
        pending = chunk if kind in (1, 2) else pending + chunk
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            records.append(record)
    return records


def offline_record(run_dir, wanted: str, timeout: float = 20.0):
    """The records of the run directory's offline W&B runs, once the ``wanted`` record kind is in
    (wandb's service process may still be flushing right after finish())."""
    deadline = time.time() + timeout
    while True:
        runs = sorted((run_dir / "wandb").glob("offline-run-*"))
        found = [read_wandb_records(next(r.glob("*.wandb"))) for r in runs]
        if all(any(rec.WhichOneof("record_type") == wanted for rec in recs) for recs in found) or time.time() > deadline:
            return found
        time.sleep(0.5)
