"""A study's points from the config: the grid (lists and spaced ranges, the
instance names, the errors), per-instance settings over them (names and
patterns, their order, their checks), and the instance names commands take.
Config-level: no Snakemake runs (test_study_runs.py has those)."""

from __future__ import annotations

import copy

import pytest
import yaml
from conftest import REPO

from waypost.model import config as wconfig
from waypost.model import paramsets

EXAMPLE = REPO / "examples" / "param-study"
STAGES = ["simulate", "data_extract", "summary_report"]
INSTANCED = ["simulate", "data_extract"]


def example_config() -> dict:
    return yaml.safe_load((EXAMPLE / "config" / "config.yaml").read_text())


def prepared(raw: dict, instances: dict | None = None) -> dict:
    config = wconfig.prepare(copy.deepcopy(raw), str(EXAMPLE / "workflow"), "study.yaml")
    return wconfig.complete(config, str(EXAMPLE / "workflow"), "study.yaml", None, STAGES, INSTANCED, instances)


def error_of(raw: dict) -> str:
    with pytest.raises(wconfig.ConfigError) as caught:
        prepared(raw)
    return str(caught.value)


def test_grid_points_are_named_by_axis_and_value_in_order():
    points = paramsets.grid_points({"nu": [0.01, 0.02], "amp": {"from": 0.5, "to": 1.0, "count": 3}}, "f: grid")
    assert list(points) == ["nu0.01-amp0.5", "nu0.01-amp0.75", "nu0.01-amp1.0",
                            "nu0.02-amp0.5", "nu0.02-amp0.75", "nu0.02-amp1.0"]
    assert points["nu0.02-amp0.75"] == {"nu": 0.02, "amp": 0.75}
    # whole numbers when both ends are; 6 significant digits otherwise; both ends exact
    assert paramsets.axis_values({"from": 10, "to": 100, "count": 4}, "k") == [10, 40, 70, 100]
    assert paramsets.axis_values({"from": 0.5, "to": 1.0, "count": 20}, "k")[1:3] == [0.526316, 0.552632]
    assert paramsets.axis_values({"from": 1e-6, "to": 2e-6, "count": 3}, "k") == [1e-6, 1.5e-6, 2e-6]
    assert paramsets.axis_values({"from": 3, "to": 3, "count": 1}, "k") == [3]
    assert list(paramsets.grid_points({"model": ["small", "large"]}, "g")) == ["modelsmall", "modellarge"]


@pytest.mark.parametrize("grid, message", [
    ({"cells": {"from": 10, "to": 15, "count": 20}},
     "study.yaml: experiments.sweep.grid.cells: 20 values from 10 to 15 repeat (at most 6 whole numbers lie "
     "between them)"),
    ({"alpha": {"from": 0.5, "to": 0.5000001, "count": 3}},
     "study.yaml: experiments.sweep.grid.alpha: 3 values from 0.5 to 0.5000001 repeat (they are rounded to 6 "
     "significant digits)"),
    ({"alpha": [1, "1"]}, "study.yaml: experiments.sweep.grid.alpha: 1 and '1' make the same instance name part '1'"),
    ({"alpha": ["a b"]}, "study.yaml: experiments.sweep.grid.alpha: the value 'a b' makes the instance name part "
                         "'alphaa b', which is not a valid name"),
    ({"policy": [1, 2]}, "study.yaml: experiments.sweep.grid.policy: 'policy' is one of waypost's stage settings"),
])
def test_a_grid_that_cant_be_made_names_the_file_and_key(grid, message):
    raw = example_config()
    raw["experiments"]["sweep"]["grid"] = grid
    raw["experiments"]["sweep"].pop("per_instance")
    assert message in error_of(raw)


def test_the_schema_checks_a_grids_shape():
    raw = example_config()
    raw["experiments"]["sweep"]["grid"]["alpha"] = {"from": 0.5, "count": 3}
    assert "experiments.sweep.grid.alpha" in error_of(raw)
    raw["experiments"]["sweep"]["grid"] = {"alpha": [0.5, 0.5]}
    assert "experiments.sweep.grid.alpha" in error_of(raw)
    raw["experiments"]["sweep"]["grid"] = {"2nd": [1]}
    assert "experiments.sweep.grid" in error_of(raw)


def test_a_points_settings_are_the_stages_its_grid_values_and_its_overrides_in_order():
    raw = example_config()
    raw["experiments"]["sweep"]["per_instance"].update({       # over the example's two bad nodes
        "alpha1.0-*": {"simulate": {"t_end": 0.05, "policy": {"max_attempts": 2}}},
        "alpha1.0-cells600": {"simulate": {"t_end": 0.02}},          # later and narrower: wins
        "*-cells[35]0*": {"data_extract": {"policy": {"depends": "all_done"}}},
    })
    config = prepared(raw)
    settings = wconfig.stage_settings(config, "sweep", "_all", "simulate", "alpha1.0-cells600")
    assert (settings["alpha"], settings["cells"], settings["t_end"]) == (1.0, 600, 0.02)
    assert settings["policy"]["max_attempts"] == 2 and settings["policy"]["runtime"] == 0.005   # merged, key by key
    assert wconfig.stage_settings(config, "sweep", "_all", "simulate", "alpha1.0-cells50")["t_end"] == 0.05
    plain = wconfig.stage_settings(config, "sweep", "_all", "simulate", "alpha0.5-cells50")
    assert plain["t_end"] == 0.1 and plain["policy"]["max_attempts"] == 6
    assert wconfig.override_keys(config, "sweep", "alpha0.5-cells300") == ("*-cells[35]0*",)
    assert wconfig.stage_settings(config, "sweep", "_all", "data_extract", "alpha0.5-cells300")["policy"]["depends"] \
        == "all_done"
    # the step's settings (and so its config hash) hold the grid values and the overrides
    step = wconfig.step_settings(config, "sweep", "_all", "simulate", "alpha1.0-cells150")
    assert step == {"t_end": 0.05, "checkpoint_every": 400, "bad_node_after": 1000, "alpha": 1.0, "cells": 150}
    assert wconfig.settings_hash(step) != wconfig.settings_hash(
        wconfig.step_settings(config, "sweep", "_all", "simulate", "alpha1.0-cells300"))
    # a funnel has no instance: no grid values, no overrides
    assert "alpha" not in wconfig.step_settings(config, "sweep", "_all", "summary_report")
    # the memoized resolver the commands use says the same
    of = wconfig.step_settings_of(config)
    for name in wconfig.points(config, "sweep"):
        assert of("sweep", "_all", "simulate", name) == wconfig.step_settings(config, "sweep", "_all", "simulate", name)


def test_what_is_derived_from_a_config_is_beside_its_keys_and_survives_its_copies():
    raw = example_config()
    config = prepared(raw)
    # the keys are the user's (with the engine's names and defaults): nothing waypost worked out
    assert set(config) <= set(wconfig.engine_schema()["properties"]) | set(raw)
    assert set(config["experiments"]["sweep"]) <= set(wconfig.engine_schema()["$defs"]["experiment"]["properties"]) \
        | set(raw["experiments"]["sweep"]) | {"pairs", "per_pair"}
    found = wconfig.derived(config)
    assert found.axis is None and found.axis_words() is None
    assert list(found.points_of("sweep"))[:2] == ["alpha0.5-cells50", "alpha0.5-cells150"]
    assert found.parameters("sweep") == ("alpha", "cells")
    for copied in (copy.deepcopy(config), wconfig.with_derived({**config}, config)):
        assert wconfig.derived(copied) == found and copied == config
    # a plain dict has nothing derived: no axis, no points
    assert wconfig.derived(dict(config)).points_of("sweep") == {}
    axis = wconfig.Axis.of("seed")
    sweep = {"seeds": ["s1"], "grid": {"rate": [1, 2]}}
    with_axis = wconfig.prepare({"root": "out", "experiments": {"x": sweep}}, "/nonexistent", "h.yaml", axis=axis)
    assert wconfig.derived(with_axis).axis_words() == {"word": "seed", "key": "seeds"}
    assert wconfig.axis_words(with_axis) == ("seed", "seeds")
    assert "_axis" not in with_axis and "_points" not in with_axis["experiments"]["x"]


def test_an_override_is_checked_like_any_setting_and_must_name_an_instance():
    raw = example_config()
    raw["experiments"]["sweep"]["per_instance"] = {
        "alpha0.7-*": {"simulate": {"t_end": 1}},
        "alpha0.5-cells50": {"summary_report": {"policy": {"max_attempts": 2}}},
        "a b": {"simulate": {"t_end": 1}},
        "alpha1.0-cells50": {"simulatee": {}},
        "alpha1.0-cells150": {"simulate": {"policy": {"cues": [{"action": "restart", "when": "cmd.TIMEDOUT"}]}}},
    }
    text = error_of(raw)
    assert "study.yaml: experiments.sweep.per_instance.alpha0.7-*: names no instance of experiment sweep (its " \
           "instances: alpha0.5-cells50, alpha0.5-cells150" in text
    assert "per_instance.alpha0.5-cells50.summary_report: stage summary_report has no instances" in text
    assert "per_instance.a b: 'a b' is neither an instance name" in text
    assert "per_instance.alpha1.0-cells50.simulatee: unknown stage 'simulatee'" in text
    assert "policy of stage simulate (experiment sweep, instance alpha1.0-cells150)" in text
    # the stage's settings (its top-level entry, no schema) say which keys a point may set
    raw["experiments"]["sweep"]["per_instance"] = {"alpha1.0-cells50": {"simulate": {"t_ned": 1}}}
    assert "study.yaml: experiments.sweep.per_instance.alpha1.0-cells50.simulate.t_ned: not a setting of stage " \
           "simulate (its settings: t_end, checkpoint_every, bad_node_after); a new one is declared with its " \
           "default in stages.simulate" in error_of(raw)


def test_a_stages_settings_are_typed_by_their_values_without_a_schema():
    """No schema file: the values in the top-level `stages` declare the
    settings and their types; overrides anywhere keep to them."""
    raw = example_config()
    sweep = raw["experiments"]["sweep"]
    sweep["per_instance"] = {"alpha1.0-cells50": {"simulate": {"bad_node_after": "5x"}},
                             "alpha1.0-cells150": {"simulate": {"checkpoint_every": 0.5}}}
    sweep["stages"] = {"simulate": {"t_end": "long"}}
    text = error_of(raw)
    assert "study.yaml: experiments.sweep.per_instance.alpha1.0-cells50.simulate.bad_node_after: '5x' is text, " \
           "and stages.simulate.bad_node_after is 0: expected a value of its type" in text
    assert "per_instance.alpha1.0-cells150.simulate.checkpoint_every: 0.5 is a number, and " \
           "stages.simulate.checkpoint_every is 400" in text
    assert "experiments.sweep.stages.simulate.t_end: 'long' is text, and stages.simulate.t_end is 0.1" in text
    # a whole number where a number is declared, a key the experiment adds, a null: fine
    sweep["per_instance"] = {"alpha1.0-cells50": {"simulate": {"t_end": 1, "mesh": "coarse", "bad_node_after": None}}}
    sweep["stages"] = {"simulate": {"mesh": "fine"}}
    settings = wconfig.stage_settings(prepared(raw), "sweep", wconfig.ALL_PAIRS, "simulate",
                                      matched=("alpha1.0-cells50",))
    assert (settings["t_end"], settings["mesh"], settings["checkpoint_every"]) == (1, "coarse", 400)


def test_an_override_may_not_set_a_grid_axis():
    raw = {"experiments": {"s": {"grid": {"a": [1, 2]}, "per_instance": {"a1": {"run": {"a": 3}}}}}}
    with pytest.raises(wconfig.ConfigError, match=r"per_instance\.a1\.run\.a: a is an axis of the grid"):
        wconfig.check_semantics(wconfig.prepare(raw, "/nonexistent", "f.yaml"), "f.yaml", None, ["run"], ["run"])


def test_instances_not_on_a_grid_are_checked_against_the_workflows_names():
    raw = {"experiments": {"s": {"per_instance": {"teacher-*": {"run": {"k": 1}}}}}}
    config = wconfig.prepare(copy.deepcopy(raw), "/nonexistent", "f.yaml")
    wconfig.check_semantics(config, "f.yaml", None, ["run"], ["run"], {"s": ["teacher-0", "teacher-1"]})
    assert wconfig.stage_settings(config, "s", "_all", "run", "teacher-1")["k"] == 1
    with pytest.raises(wconfig.ConfigError, match="names no instance of experiment s"):
        wconfig.check_semantics(config, "f.yaml", None, ["run"], ["run"], {"s": ["student"]})
    # not knowing the workflow's instances (a command that did not read them): not checked
    wconfig.check_semantics(config, "f.yaml", None, ["run"], ["run"])


def test_instance_names_given_to_a_command_are_checked():
    config = prepared(example_config())
    wconfig.check_instance_names(config, ["alpha0.5-cells50", "alpha9*"], "sweep")   # a point; a pattern
    wconfig.check_instance_names(config, ["left-over"], None, found={"left-over"})     # a directory there
    with pytest.raises(wconfig.ConfigError, match=r"^unknown instance 'alpha0.7-cells50': not an instance of "
                                                  r"experiment sweep \(instances: alpha0.5-cells50, .* \(8 in all\); "
                                                  r"or a shell pattern, quoted\)$"):
        wconfig.check_instance_names(config, ["alpha0.7-cells50"])
    with pytest.raises(wconfig.ConfigError, match="neither a valid name"):
        wconfig.check_instance_names(config, ["../x"])
    assert wconfig.match_instances(["*-cells600", "alpha0.5-cells50"], wconfig.points(config, "sweep")) == \
        ["alpha0.5-cells50", "alpha0.5-cells600", "alpha1.0-cells600"]


def test_a_points_step_spec_is_its_scopes_line_with_its_own_settings_and_hash():
    """The planner encodes a scope's step spec once and puts each grid
    point's settings and their hash into it: the line is the one the
    point's fields encode to."""
    from waypost.model import spec
    from waypost.model.config import settings_hash
    from waypost.planning.stepline import point_line, scope_template
    scope = {"t_end": 0.1, "label": "a \"quoted\" é", "policy": {"max_attempts": 2}, "worker": "cpu"}
    base = {k: v for k, v in scope.items() if k not in ("policy", "worker")}
    fields = {"stage": "simulate", "experiment": "sweep", "settings": base, "policy": {"max_attempts": 2},
              "config_hash": settings_hash(base), "code_version": "sha256:0", "pool": "local",
              "worker_class": "cpu", "worker_env": {"GPUS": "0"}, "tolerated": True,
              "shell": {"executable": "/bin/bash", "prefix": "set -euo pipefail; ", "suffix": ""}}
    template = scope_template(fields, scope)
    for values in ({"alpha": 0.5, "cells": 3}, {"t_end": 0.2}, {"zeta": [1, "{x}"]}, {}):
        settings = {**base, **values}
        assert point_line(template, values) == spec.encode(
            {**fields, "settings": settings, "config_hash": settings_hash(settings)})


def test_one_experiments_instance_overrides_do_not_reword_the_next_experiments_problems():
    raw = {"experiments": {"left": {"per_instance": {"run-?": {"run": {"k": 2}}}},
                           "right": {"reuse": {"run": {"nowhere": "left"}}}}}
    with pytest.raises(wconfig.ConfigError) as caught:
        wconfig.check_semantics(wconfig.prepare(raw, "/nonexistent", "g.yaml"), "g.yaml", None, ["run"], ["run"])
    assert "experiments.right.reuse.run.nowhere: unknown axis value 'nowhere' (expected one of this " \
           "experiment's axis values: none)" in str(caught.value)
