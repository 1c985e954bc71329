"""What a planning does not schedule: stages on hold in the root's registry
(``layout.HELD``: given up, or waiting out their series' backoff), reused
stages waiting for a source this run doesn't make (``StateView.reuse_plan``),
and what needs their success, in their experiment and in those that reuse
them."""

from __future__ import annotations

import os
import time

from waypost import stores
from waypost.model import layout


def registry_entries(root: str, on_bucket: bool) -> dict[str, float]:
    """Entry name → its mtime (0: held for good), in one listing."""
    registry = layout.join(root, layout.HELD)
    if not on_bucket:
        try:
            return {name: os.stat(os.path.join(registry, name)).st_mtime for name in os.listdir(registry)}
        except OSError:
            return {}
    prefix = stores.filesystem(registry)[1] + "/"
    return {key[len(prefix):]: stores.mtime_of(info) for key, info in stores.listing(root).items()
            if key.startswith(prefix)}


class Holds:
    """The (experiment, pair, stage, instance) not to schedule (instance
    None: none of the stage's), and a line saying why for each entry.

    ``policy(experiment, pair, stage, instance)``, ``recorded(stage_dir)``
    (a manifest, or None), ``reusers(experiment, pair, stage)`` (the
    experiments taking it by name) and ``waiting`` ((experiment, pair,
    stage, instance) → why: reused stages whose source is on its way) come
    from the planning."""

    def __init__(self, root: str, on_bucket: bool, stages: dict, policy, recorded, reusers=None,
                 waiting: dict | None = None):
        self.held: set[tuple] = set()
        self.said: list[str] = []
        self._stages, self._policy = stages, policy
        self._reusers = reusers or (lambda experiment, pair, stage: [])
        for key, why in (waiting or {}).items():
            self.said.append(why)
            self._hold(*key, None)
        self.registered = False   # something held by the registry (what `waypost retry` takes off)
        now = time.time()
        for name, until in sorted(registry_entries(root, on_bucket).items()):
            parts = name.split("~")
            if len(parts) < 3 or (until and until <= now):
                continue
            self.registered = True
            pair, experiment, stage = parts[:3]
            instance = parts[3] if len(parts) > 3 else None
            self.said.append(f"{layout.stage_name(*parts)} " + ("given up" if not until else
                                             "waiting until " + time.strftime("%H:%M", time.localtime(until))))
            # A given-up stage ended for good: its last end is what a funnel's
            # `depends` looks at, as when it ended (one in its backoff will be
            # redone: what is below waits for it).
            state = None if until else (recorded(layout.stage_dir(root, pair, experiment, stage, instance))
                                        or {}).get("state")
            self._hold(experiment, pair, stage, instance, state)

    def _hold(self, experiment: str, pair: str, stage: str, instance: str | None, state: str | None) -> None:
        """Hold (experiment, pair, stage, instance) and what needs its
        success: a consumer with instances at the same instance, any other
        (a funnel over the instances, over the pairs) as a whole; not a
        consumer whose ``depends`` accepts ``state`` (the held stage's last
        end, None while it is to be redone), which goes on over it."""
        key = (experiment, pair, stage, instance)
        if key in self.held:
            return
        self.held.add(key)
        for other in self._reusers(experiment, pair, stage):   # its copies wait with it
            self._hold(other, pair, stage, instance, None)
        for child, spec in self._stages.items():
            if stage not in spec.parents:
                continue
            child_pair = layout.ALL_PAIRS if spec.funnel else pair
            child_instance = instance if spec.instances is not None else None
            if state is not None and self._policy(experiment, child_pair, child, child_instance).accepts(state):
                continue
            self._hold(experiment, child_pair, child, child_instance, None)

    def holds(self, stage: str, experiment: str, pair: str, instance: str | None) -> bool:
        return (experiment, pair, stage, None) in self.held or (experiment, pair, stage, instance) in self.held
