"""The flags of a run's options, shared by the three commands that take them: ``marin run`` (and
``plan``, ``why``, ``graph``, ``results``), ``marin export airflow`` and ``marin export prefect``.

``add_run_flags(parser, *names)`` adds the named flags (``FLAGS``; an exporter gives its own help
where the value goes into its DAG or deployment), and ``run_options(args)`` makes the parsed
arguments one ``RunOptions``, checked once (by ``RunOptions``, not by argparse: one message
for a bad value wherever it comes from): the options, ``--scope``, and the codex of
``--version``/``--override``.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from marin.execution.errors import MarinError
from marin.execution.pipeline.versions import codex_from_args
from marin.execution.plan.options import (
    DEFAULT_MAX_CONCURRENT,
    DEFAULT_MAX_REMOTE,
    DEFAULT_ON_CODE_DRIFT,
    DEFAULT_ON_DRIFT,
    DRIFT_POLICIES,
    RunOptions,
    check_patterns,
    split_names,
)
from marin.execution.vocabulary import OutputScope

PREFIX_HELP = (
    "where artifacts live: a path, memory://, gs://, s3:// "
    "(default: $MARIN_PREFIX, else ./marin-artifacts)"
)
DRIFT_HELP = (
    "a built step whose config changed without a version bump: serve it with a warning "
    "(warn, the default), rebuild it (rebuild), or stop with an error (error)"
)
CODE_DRIFT_HELP = (
    "a built step whose code (its function, or a same-project function or class it calls) "
    "changed since it was built: serve it with a warning (warn, the default), rebuild it in "
    "place (rebuild), or stop with an error (error); separate from --on-drift, because code "
    "drift is advisory (docs/caching.md)"
)
FORCE_HELP = (
    "rebuild this step even if it is built (name or name@version); repeat the flag or give a "
    "comma list: --force a --force b,c"
)
CASCADE_HELP = (
    "serve steps whose upstream was rebuilt, with a warning, instead of rebuilding them "
    "(default: a rebuilt step's readers are rebuilt too)"
)
SELECT_HELP = (
    "only the steps matching this glob (on name or name@version, e.g. 'ngram/eval/*'), and "
    "what they need; repeat the flag or give a comma list"
)
EXCLUDE_HELP = "leave out the steps matching this glob, and every step that reads them"


def _names(text: str) -> list[str]:
    """One ``--force`` value: a name, or a comma list of names (empty items are errors)."""
    names = split_names(text)
    if not all(names):
        raise argparse.ArgumentTypeError(
            f"{text!r} has an empty name: use --force NAME, repeated or as a comma list a,b"
        )
    return names


def usage_checked(check: Callable[[str], Any], text: str) -> Any:
    """``check(text)``, a bad value made argparse's usage error (exit 2) in the core's words.

    Raises:
        argparse.ArgumentTypeError: ``check`` raised a ``MarinError``.
    """
    try:
        return check(text)
    except MarinError as exc:
        raise argparse.ArgumentTypeError(f"{exc.what}: {exc.fix}") from None


def _patterns(text: str) -> list[str]:
    """One ``--select``/``--exclude`` value: a glob, or a comma list of them."""
    return list(usage_checked(check_patterns, text))


def prefix_arg(text: str) -> str:
    """``--prefix``: not empty (an empty value would quietly mean the default)."""
    if not text.strip():
        raise argparse.ArgumentTypeError(
            "is empty: give a path or URL, or leave --prefix out to use $MARIN_PREFIX or "
            "./marin-artifacts"
        )
    return text


class Extend(argparse.Action):
    """``--force a --force b,c`` -> ``["a", "b", "c"]``: one name per flag, or a comma list."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        current = list(getattr(namespace, self.dest, None) or [])
        current.extend(values)
        setattr(namespace, self.dest, current)


_LISTED: dict[str, Any] = {"action": Extend, "default": []}
FLAGS: dict[str, tuple[tuple[str, ...], dict[str, Any]]] = {
    "verbose": (("-v", "--verbose"), {"action": "store_true", "default": argparse.SUPPRESS,
                                      "help": "debug logging, and tracebacks for errors"}),
    "prefix": (("--prefix",), {"type": prefix_arg, "default": argparse.SUPPRESS,
                               "help": PREFIX_HELP}),
    "select": (("--select",), {**_LISTED, "type": _patterns, "metavar": "PATTERN",
                               "help": SELECT_HELP}),
    "exclude": (("--exclude",), {**_LISTED, "type": _patterns, "metavar": "PATTERN",
                                 "help": EXCLUDE_HELP}),
    "version": (("--version",), {"dest": "run_version", "metavar": "V",
                                 "help": "the version of every step that defers its version "
                                 "(version=None)"}),
    "override": (("--override",), {"action": "append", "default": [], "metavar": "NAME=V",
                                   "help": "the version of one deferred step (repeatable); "
                                   "naming no such step is an error"}),
    "scope": (("--scope",), {"choices": tuple(OutputScope), "default": OutputScope.SHARED,
                             "help": "user: build every step under PREFIX/users/$MARIN_USER/, "
                             "reading shared builds it has not built itself (default: each "
                             "step's with_options(scope=...))"}),
    "max_concurrent": (("--max-concurrent",), {"type": int, "metavar": "N",
                                               "default": DEFAULT_MAX_CONCURRENT,
                                               "help": "steps at once (default "
                                               f"{DEFAULT_MAX_CONCURRENT})"}),
    "max_remote": (("--max-remote",), {"type": int, "metavar": "N",
                                       "default": DEFAULT_MAX_REMOTE,
                                       "help": "remote steps' jobs in flight; they hold no "
                                       f"step slot (default {DEFAULT_MAX_REMOTE})"}),
    "force": (("--force",), {**_LISTED, "type": _names, "metavar": "NAME", "help": FORCE_HELP}),
    "on_drift": (("--on-drift",), {"choices": DRIFT_POLICIES, "default": DEFAULT_ON_DRIFT,
                                   "help": DRIFT_HELP}),
    "on_code_drift": (("--on-code-drift",), {"choices": DRIFT_POLICIES,
                                             "default": DEFAULT_ON_CODE_DRIFT,
                                             "help": CODE_DRIFT_HELP}),
    "cascade": (("--no-cascade",), {"dest": "cascade", "action": "store_false",
                                    "help": CASCADE_HELP}),
    "keep_going": (("--keep-going",), {"action": "store_true",
                                       "help": "after a failure, keep building independent "
                                       "branches"}),
}  # fmt: skip
"""A flag's name -> its ``add_argument`` arguments."""


def add_run_flags(
    parser: argparse.ArgumentParser, *names: str, help: Mapping[str, str] | None = None
) -> None:
    """Add the flags ``names`` (keys of ``FLAGS``) to ``parser``; ``help`` replaces a flag's
    help text (an exporter saying where its value goes).

    Raises:
        KeyError: a name that is no flag of ``FLAGS``.
    """
    for name in names:
        flags, kwargs = FLAGS[name]
        parser.add_argument(*flags, **{**kwargs, **({"help": help[name]} if help and name in
                                                    help else {})})  # fmt: skip


def run_options(args: argparse.Namespace) -> RunOptions:
    """The parsed arguments as one ``RunOptions``, made and checked once: each run option the
    command has (one it lacks: the default), ``--scope``, and the codex of ``--version`` and
    ``--override``.

    Raises:
        OptionError: a value that is not valid for its option.
        InvalidStepError: an ``--override`` that is not ``NAME=V``.
    """
    options = RunOptions.from_params(vars(args))
    codex = codex_from_args(getattr(args, "run_version", None), getattr(args, "override", []))
    scope = getattr(args, "scope", OutputScope.SHARED)
    if codex is None and scope == OutputScope.SHARED:
        return options
    return dataclasses.replace(options, scope=scope, versions=codex)
