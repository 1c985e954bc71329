"""Snakemake's job events, as waypost reads them: a logger plugin.

``snakemake --logger waypost --logger-waypost-events FILE`` appends one JSON
line per job event Snakemake reports through its logger-plugin interface
(snakemake-interface-logger-plugins): a job planned or started
(``job_info``: its rule, wildcards and reason), one that failed
(``job_error``), one that finished, and the run's job counts (``run_info``).
``waypost plan`` and ``waypost cron`` read these (``waypost.model.events``)
instead of Snakemake's printed text; Snakemake's own output is unchanged.
"""

from dataclasses import dataclass, field
from typing import Optional

from snakemake_interface_logger_plugins.base import LogHandlerBase
from snakemake_interface_logger_plugins.settings import LogHandlerSettingsBase

from waypost.model import events


@dataclass
class LogHandlerSettings(LogHandlerSettingsBase):
    # (no ``from __future__ import annotations``: Snakemake calls the type to parse the option)
    events: Optional[str] = field(  # noqa: UP045
        default=None,
        metadata={"help": "the file to append Snakemake's job events to, one JSON line each "
                          f"(default: ${events.EVENTS_ENV})", "env_var": False, "required": False})


class LogHandler(LogHandlerBase):
    def __post_init__(self) -> None:
        self.path = (self.settings.events if self.settings else None) or events.path_from_env()

    def emit(self, record) -> None:
        if self.path is None:
            return
        found = events.from_record(record)
        if found is not None:
            events.append(self.path, found)

    @property
    def writes_to_stream(self) -> bool:
        return False

    @property
    def writes_to_file(self) -> bool:
        return False   # Snakemake would take it for a log file of its own

    @property
    def has_filter(self) -> bool:
        return True    # every job event, whatever Snakemake's quietness

    @property
    def has_formatter(self) -> bool:
        return True

    @property
    def needs_rulegraph(self) -> bool:
        return False
