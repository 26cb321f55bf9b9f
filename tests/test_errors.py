"""One error hierarchy: every error lbbench raises for a user's input or setup is a ``UserError`` (``InputError`` or
``SetupError``), which the command group turns into one line and exit code 2; anything else keeps its traceback."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import click
import pytest
from click.testing import CliRunner

import lbbench
from lbbench.cli import main
from lbbench.cli.main import LbbenchGroup
from lbbench.errors import InputError, SetupError, UserError

#: exception classes that are not user errors, and why
INTERNAL = {
    "lbbench.distributed.executors.UnitError": "a unit's worker died twice: the run keeps what finished, exit 1",
    "lbbench.distributed.actors.WorkerDied": "a pool's worker process ended: retried, then a UnitError",
    "lbbench.planning.search.TargetNotMetError": "the search's signal that no count meets the target: caught",
    "lbbench.engines.vllm.emulator._BadRequest": "the emulator's HTTP 400 to its own client",
    "lbbench.proxy.gateway._Shed": "flow control shed a request: the gateway answers its client 429 or 503",
    "lbbench.measured.schema.CellError": "a cell's problem in words: the reader wraps it in a MeasuredRowError "
                                         "naming the file, row and column",
}
#: optional extras a module may need; a module that cannot import for want of one is not walked
EXTRAS = {"torch", "gymnasium", "transformers", "tokenizers", "sklearn", "ray", "matplotlib"}


def _exception_classes() -> dict[str, type[BaseException]]:
    found: dict[str, type[BaseException]] = {}
    for info in pkgutil.walk_packages(lbbench.__path__, "lbbench."):
        try:
            module = importlib.import_module(info.name)
        except ModuleNotFoundError as exc:
            if (exc.name or "").split(".")[0] in EXTRAS:
                continue
            raise
        for name, cls in inspect.getmembers(module, inspect.isclass):
            if issubclass(cls, BaseException) and cls.__module__ == info.name:
                found[f"{info.name}.{name}"] = cls
    return found


def test_every_exception_class_is_a_user_error_or_named_internal():
    classes = _exception_classes()
    assert len(classes) >= 30  # the walk reached the package (33 classes when written)
    for qualified, cls in classes.items():
        if qualified in INTERNAL:
            assert not issubclass(cls, UserError), f"{qualified} is listed internal but is a user error"
            continue
        assert issubclass(cls, (InputError, SetupError)) or cls is UserError, (
            f"{qualified} derives from {[b.__name__ for b in cls.__mro__[1:]]}: make it an InputError (bad input) "
            "or a SetupError (what the input points at does not work), or list it in INTERNAL with the reason")
    assert set(INTERNAL) <= set(classes), "INTERNAL names a class that no longer exists"


def test_input_and_setup_errors_keep_their_builtin_kinds():
    """``except ValueError`` / ``except RuntimeError`` callers still catch what they caught."""
    from lbbench.dispatch import RouterError
    from lbbench.engines.vllm.launcher import LaunchError
    from lbbench.profiles import ProfileError
    from lbbench.workloads.errors import TraceError

    assert issubclass(ProfileError, ValueError) and issubclass(TraceError, ValueError)
    assert issubclass(LaunchError, RuntimeError) and issubclass(RouterError, RuntimeError)
    err = InputError("-1 must be > 0", "rate_per_s")
    assert str(err) == "rate_per_s: -1 must be > 0" and err.field == "rate_per_s" and err.problem == "-1 must be > 0"


@pytest.mark.parametrize("args, needle", [
    (["run", "--profile", "no-such-profile"], "no-such-profile"),                     # ProfileError
    (["run", "--router", "no_such_router"], "unknown router 'no_such_router'"),       # UnknownRouterError
    (["run", "--fleet", "llama2-7b-v100:x"], "llama2-7b-v100:x"),                     # FleetError
    (["run", "--workload", "dataset:/no/such/file.jsonl"], "/no/such/file.jsonl"),    # DataError
    (["run", "--predictor", "nope:1"], "nope:1"),                                     # PredictorSpecError
    (["report", "/no/such/run"], "/no/such/run: no such run directory"),              # RunDirError
    (["profile", "derive", "--model", "llama-2-7b", "--gpu", "no-such-gpu", "--out", "x.toml"],
     "no-such-gpu"),                                                                   # UnknownGPUError
])
def test_library_errors_print_one_line_and_exit_2(args, needle, tmp_path):
    res = CliRunner().invoke(main, [*args, *(["--out", str(tmp_path / "o")] if args[0] == "run" else [])])
    assert res.exit_code == 2, res.output
    text = res.output.strip()  # a run's progress bar may leave a blank line on stderr
    assert text.startswith("Error: ") and text.count("\n") == 0, res.output
    assert needle in res.output


def test_the_group_maps_a_field_to_its_flag_and_leaves_other_errors_alone():
    group = LbbenchGroup("g")

    @group.command("input")
    def input_cmd() -> None:
        raise InputError("-1 must be > 0", "rate_per_s")

    @group.command("setup")
    def setup_cmd() -> None:
        raise SetupError("http://h:1: not a vLLM server")

    @group.command("bug")
    def bug_cmd() -> None:
        raise KeyError("not a user error")

    res = CliRunner().invoke(group, ["input"])
    assert (res.exit_code, res.output) == (2, "Error: --rate: -1 must be > 0\n")
    res = CliRunner().invoke(group, ["setup"])
    assert (res.exit_code, res.output) == (2, "Error: http://h:1: not a vLLM server\n")
    res = CliRunner().invoke(group, ["bug"])
    assert res.exit_code == 1 and isinstance(res.exception, KeyError)
    assert isinstance(group, click.Group)
