"""Every error waypost raises on purpose derives from one base, WaypostError:
the CLI prints such an error as its one line and lets anything else show its
traceback (a bug), so an error class outside the base would turn a user's
mistake into a traceback."""

import importlib
import inspect
import pkgutil

import pytest

import waypost
from waypost.model.errors import WaypostError

# Scripts that run something when imported (the step runner's launcher
# starts the runner), not libraries: they define no classes.
ENTRY_POINTS = {"__main__", "launch"}


def _modules():
    for info in pkgutil.walk_packages(waypost.__path__, "waypost."):
        if info.name.rsplit(".", 1)[-1] in ENTRY_POINTS:
            continue
        yield importlib.import_module(info.name)


def _error_classes():
    for module in _modules():
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if issubclass(cls, BaseException) and cls.__module__ == module.__name__:
                yield cls


def test_the_walk_sees_the_package():
    names = {cls.__name__ for cls in _error_classes()}
    assert {"ConfigError", "ManifestError", "StorageError", "Unrecorded", "StageError", "WaypostError"} <= names


def test_every_error_class_derives_from_waypost_error():
    outside = sorted(f"{cls.__module__}.{cls.__qualname__}" for cls in _error_classes()
                     if not issubclass(cls, WaypostError))
    assert outside == []


def test_the_other_bases_stay():
    """Callers catch some of them by their older base."""
    from waypost.model.config import ConfigError
    from waypost.model.writes import Unrecorded
    from waypost.stores.gcs import StorageError
    assert issubclass(ConfigError, ValueError)
    assert issubclass(Unrecorded, OSError)
    assert issubclass(StorageError, RuntimeError)


def test_the_cli_prints_a_waypost_error_as_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "config.yaml").write_text("experiments: [\n")   # not YAML
    assert importlib.import_module("waypost.cli.main").main(["plan", "--config", "config.yaml"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("waypost: ") and err.count("\n") == 1 and "Traceback" not in err


def test_the_cli_lets_a_bug_show_its_traceback(monkeypatch):
    """Anything that is not a WaypostError is a bug: it is not turned into a
    line (a RuntimeError was, before WaypostError)."""
    cli = importlib.import_module("waypost.cli.main")

    def broken(args):
        raise RuntimeError("a bug in waypost")

    monkeypatch.setattr(cli, "cmd_status", broken)   # the parser is built at each call: it takes this one
    with pytest.raises(RuntimeError, match="a bug in waypost"):
        cli.main(["status"])
