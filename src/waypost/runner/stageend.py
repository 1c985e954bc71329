"""A series' end in its stage directory: the manifest (written last, after
the outputs it describes), the markers that say when a later run looks at
the stage again, the root's registry entry of a held or given-up stage, and
the job's exit status. ``StageRun.finish`` says it; see ``waypost.runner``
for the whole."""

from __future__ import annotations

import sys
import time

from waypost.model import fingerprints, manifest, records, states
from waypost.model import policy as wpolicy
from waypost.model import spec as wspec
from waypost.model.layout import PROVISIONAL, UNFINISHED
from waypost.runner.series import Series
from waypost.runner.stagedir import StageDirectory
from waypost.state.parents import describe_inputs


class SeriesEnd:
    """How one series of a stage ended, written into its directory."""

    def __init__(self, step: wspec.StepSpec, directory: StageDirectory, series: Series, policy: wpolicy.Policy,
                 outside: list[str], outside_seen: dict[str, tuple | None], received_signal: int | None):
        self.spec, self.directory, self.series, self.policy = step, directory, series, policy
        self.name = directory.name
        # The inputs no stage of the root made, and what size and time said of
        # each as the last attempt began (their fingerprints in the manifest).
        self.outside, self.outside_seen = outside, outside_seen
        self.received_signal = received_signal

    def write(self, state: str, reason: str | None = None, give_up: str | None = None,
              goes_on: dict | None = None, stop: str | None = None) -> int:
        """Write the manifest (last): the series ended ``state``. ``give_up``:
        the policy gave the stage up for good (a ``give_up`` cue: why), so no
        run starts another series until ``waypost retry``. ``goes_on``: it
        was cancelled from outside, and the next run goes on with it in place
        (neither given up nor held for it). ``stop``: a stop cue (why) ended
        it and this run: recorded (``stopped_run``), for the driver to stop."""
        directory, series = self.directory, self.series
        record = self._manifest(state)
        if goes_on:
            record["goes_on"] = goes_on
        if stop:
            record["stopped_run"] = stop
            reason = (f"{reason}; " if reason else "") + "stopped the run: no new job started in it"
        now = time.time()
        redo_from, hold = now, None
        if state != "SUCCESS" and series.attempts and not goes_on:
            reason, redo_from, hold = self._given_up_or_held(record, reason, give_up, now)
        if reason:
            record["reason"] = reason
            print(f"waypost: {self.name} {state}: {reason}", file=sys.stderr)
        tolerated = state != "SUCCESS" and self.spec.tolerated and self.received_signal is None and not stop
        if tolerated:
            directory.placeholders()
        path = manifest.manifest_path(directory.dir)
        manifest.write_json_atomic(path, records.checked("manifest", record, path))
        if directory.remote:  # outputs only where they count; the manifest last
            directory.remote.push(directory.outputs, final=state == "SUCCESS" or tolerated)
        self._set_markers(state, record, tolerated, redo_from, now)
        directory.register_hold(hold)
        directory.remove_running()
        if directory.remote:
            directory.remote.close()
        return self._exit_status(state, record, tolerated)

    def _manifest(self, state: str) -> records.Manifest:
        """The manifest of the series that ended ``state``, as the step left
        the stage: its attempts, outputs (a success's), inputs and settings."""
        directory, series = self.directory, self.series
        outputs = self._described_outputs() if state == "SUCCESS" else []
        inputs = self._described_inputs()
        record = records.manifest(
            experiment=self.spec.experiment, pair=self.spec.pair, stage=self.spec.stage,
            instance=self.spec.instance, state=state, created=manifest.now_iso(), attempts=series.history,
            outputs=outputs, inputs=inputs,
            settings=self.spec.settings, config_hash=self.spec.config_hash, code_version=self.spec.code_version,
            run=series.run_id, **directory.job.record_fields(),
            triggers=self.spec.triggers or None,
        )
        if series.base:
            record["series_base"] = series.base
        # A stage that ran over parents that did not succeed (a funnel), or
        # over provisional ones, is provisional: the next run looks at those
        # parents again and redoes it when one of them is redone.
        unsound = [i["path"] for i in inputs if i["state"] not in states.SOUND_INPUTS or i["provisional"]]
        record["provisional"] = state == "SUCCESS" and bool(unsound)
        return record

    def _set_markers(self, state: str, record: records.Manifest, tolerated: bool, redo_from: float,
                     now: float) -> None:
        """A skipped stage is looked at again when one of its parents is
        redone (a parent given up is not: nor is its consumer), a failed one
        is redone; a provisional one, when a parent is."""
        series, directory = self.series, self.directory
        marked = series.attempts[-1]["state"] if series.attempts else "SKIPPED"
        directory.set_marker(UNFINISHED, redo_from if tolerated and state != "SKIPPED"
                             and not record.get("given_up") else None, marked)
        directory.set_marker(PROVISIONAL, now if record["provisional"] or (tolerated and state == "SKIPPED")
                             else None, marked)

    def _described_outputs(self) -> list[dict]:
        """The manifest's outputs: the declared ones, and (a rule in its own
        layout) its side files (what it left in directories other jobs
        write too is not taken)."""
        directory = self.directory
        side = directory.workspace.side_files()
        left = directory.workspace.left_in_shared()
        if left:
            shown = ", ".join(left[:3]) + (f" and {len(left) - 3} more" if len(left) > 3 else "")
            print(f"waypost: {directory.name}: {shown}: left beside its outputs, in a directory other jobs write "
                  "too, and no rule declares: not recorded, archived or reused with the job (declare it as an "
                  "output, or write it in a directory only this job writes)", file=sys.stderr)
        return manifest.describe_outputs(directory.base, [*directory.outputs, *side], directory.temporary, side)

    def _described_inputs(self) -> list[dict]:
        """The manifest's inputs: each with its producer's manifest, an
        input from outside the root with its fingerprint."""
        inputs = describe_inputs(self.directory.inputs, self.spec.input_records)
        for item in inputs:
            if item["path"] in self.outside:
                item["fingerprint"] = fingerprints.take(item["path"], self.outside_seen.get(item["path"]))
        if self.directory.remote:
            inputs = self.directory.remote.locate(inputs)
        return inputs

    def _given_up_or_held(self, record: records.Manifest, reason: str | None, give_up: str | None,
                          now: float) -> tuple[str | None, float, float | None]:
        """A series that ended without success: given up (by a cue, or its
        ``max_series`` spent) or held for its ``series_backoff``, marked in
        ``record``. The reason to record, when the next run may redo the
        stage, and the root's registry entry (``layout.HELD``: until when it
        waits; 0: given up; None: it doesn't)."""
        spent = self.series.number - self.series.base
        if give_up:
            record["given_up"] = True
            return (f"{reason}; " if reason else "") + f"given up by {give_up}", now, 0.0
        if spent >= self.policy.max_series:
            record["given_up"] = True
            return ((f"{reason}; " if reason else "")
                    + f"given up after {spent} series (max_series {self.policy.max_series})"), now, 0.0
        if self.policy.backoff_seconds(spent):
            redo_from = now + self.policy.backoff_seconds(spent)
            record["next_series_after"] = manifest.epoch_to_iso(redo_from)
            return reason, redo_from, redo_from
        return reason, now, None

    def _exit_status(self, state: str, record: records.Manifest, tolerated: bool) -> int:
        """The job's exit status once the manifest says ``state``: 0 for a
        success or an end a downstream funnel accepts, else the last
        attempt's."""
        if state == "SUCCESS":
            return 0
        if tolerated:
            later = ("it is given up: `waypost retry` or `waypost rerun` to try again" if record.get("given_up")
                     else "the next run redoes this stage")
            print(f"waypost: {self.name} recorded as {state}; a downstream funnel accepts it, "
                  f"so the run goes on ({later})", file=sys.stderr)
            return 0
        last = self.series.attempts[-1] if self.series.attempts else {}
        if last.get("exit_code"):
            return last["exit_code"]
        if last.get("signal") or self.received_signal:
            return 128 + (last.get("signal") or self.received_signal)
        return 1
