"""``data_prep.prepare --output s3://...|gs://...``: prepared locally, then uploaded.

Beam's shard writers are ArrayRecord's local-file writers, and a split is replaced whole
by a directory rename, which object stores do not have. So the split is prepared into a
local staging directory (under the storage cache, ``jaxspeech.common.storage.cache_root``) and
uploaded with its ``index.json`` last: the index is the split's commit marker, deleted
first when a split is replaced, so readers see the old split, no split, or the new one,
never a mix (`jaxspeech.common.storage.upload_dir`). The train split's tokenizer is uploaded
before the split. The bucket is checked before any work.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import tempfile
from collections.abc import Callable
from typing import Any

from data_prep.config import PrepConfig
from data_prep.readers.common import PrepareError
from data_prep.staging import write_json
from jaxspeech.common import storage

TOKENIZER = "tokenizer"


def prepare_to_store(
    cfg: PrepConfig, prepare_local: Callable[[PrepConfig], dict[str, Any]]
) -> dict[str, Any]:
    """Runs ``prepare_local`` on a local copy of ``cfg`` and uploads its output to
    ``cfg.output``; returns the report with the store's paths.

    Raises:
      PrepareError: the bucket is missing or unreachable, or an upload failed (one line);
        anything ``prepare_local`` raises (nothing is uploaded then).
    """
    try:
        storage.check_bucket(cfg.output)
    except storage.StorageError as e:
        raise PrepareError(str(e)) from e
    os.makedirs(storage.cache_root(), exist_ok=True)
    local = tempfile.mkdtemp(prefix="prepare-", dir=storage.cache_root())
    try:
        report = prepare_local(dataclasses.replace(cfg, output=local))
        report["split_dir"] = storage.join(cfg.output, cfg.split)
        report_path = os.path.join(local, cfg.split, "prep_report.json")
        write_json(report, report_path)  # as prepare wrote it, with the store's path
        try:
            if os.path.isdir(os.path.join(local, TOKENIZER)):
                storage.upload_dir(
                    os.path.join(local, TOKENIZER), storage.join(cfg.output, TOKENIZER), ()
                )
            storage.upload_dir(os.path.join(local, cfg.split), storage.join(cfg.output, cfg.split))
        except storage.StorageError as e:
            raise PrepareError(f"{e} (the split was not committed: upload it again)") from e
    finally:
        shutil.rmtree(local, ignore_errors=True)
    return report
