"""Corpus preparation (`python -m data_prep.prepare`), checks (`data_prep.verify`) and
n-gram LMs (`data_prep.lm`).

Importing Apache Beam logs a warning that its optional BigQuery client is missing (this
package never uses BigQuery), through the root logger, before any command's code runs:
this filter, installed when the package is imported, i.e. before any of its modules
imports Beam, drops that one message. Beam's worker processes print it too; the commands
drop those lines with the rest of Beam's routine output (`data_prep.runner`).
"""

import logging

import jaxspeech  # noqa: F401  (numba's cache made safe, Ctrl-C as one line: its __init__)


def _not_beam_bigquery_notice(record: logging.LogRecord) -> bool:
    return not str(record.msg).startswith("apitools not found, and bigquery client")


logging.getLogger().addFilter(_not_beam_bigquery_notice)
