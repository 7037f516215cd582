"""Parsers: bytes in, typed frames for the run's tables out. One module per input format.

Each file-level parser module has ``KIND``, ``sniff(head, name)`` and ``parse(source)``,
which yields ``(table, polars.DataFrame)`` pairs whose columns are the table's
(``postmortem.schema``). Discovery asks the sniffers in ``FILE_PARSERS`` order; the first
that claims a file parses it. Parsers know nothing of signatures or of the CLI.
"""

from . import (
    error_file,
    flight_recorder,
    hf_trainer_state,
    memory_snapshot,
    metrics_csv,
    ncclras,
    nvidia_smi_csv,
    profiler,
    pyspy,
    textlog,
    torch_trace,
)

# Most specific first: every text format would also pass the text sniffer.
# The profiler comes before the flight recorder: a Kineto trace's distributedInfo holds a
# "pg_config" too.
# A trainer state, an `ncclras -f json` report and the CSV files are text too.
FILE_PARSERS = (error_file, profiler, flight_recorder, memory_snapshot, pyspy, torch_trace, hf_trainer_state,
                ncclras, nvidia_smi_csv, metrics_csv, textlog)
BY_KIND = {parser.KIND: parser for parser in FILE_PARSERS}  # the parser of each kind discovery names
