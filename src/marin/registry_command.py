"""``marin register NAME@VERSION --id ns/name/tag``: release a build under a stable id."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from marin.terminal_text import safe_json, safe_text

_EPILOG = """examples:
  marin register ngram/dataset@v1 --id datasets/ngram/v1 --prefix /tmp/marin
  marin register ngram/models/bigram-add-k@v1 --id models/bigram/2026.11 --json

In Python: Artifact.from_id("datasets/ngram/v1") resolves the id (one read).
A registered build is frozen: marin run --force (or a drift rebuild) of its
name@version is refused; bump the version instead.
A registration is never replaced: an id is taken once. Registered builds, and
every build they were made from, are kept by marin gc whatever its targets.
exit status: 0 registered, 1 the id is taken already, 2 any other error
(a bad id, nothing built, the step being built or deleted): nothing written."""


def add_register_parser(commands: Any, add_global: Any) -> None:
    """Add ``register`` to the ``marin`` sub-commands; ``add_global`` adds ``--prefix``, ``-v``."""
    register = commands.add_parser(
        "register",
        help="release a built step under a stable id (ns/name/tag), kept by gc",
        description="Register the build of STEP under the prefix as ID: an append-only\n"
        "manifest under PREFIX/registry.marin/, created only if the id is free.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    register.add_argument(
        "step", metavar="STEP", help="name@version (or a name: its latest build) to register"
    )
    register.add_argument(
        "--id",
        dest="artifact_id",
        required=True,
        metavar="ID",
        help="namespace/name/tag, e.g. datasets/fineweb/v3",
    )
    add_global(register)
    register.add_argument("--json", action="store_true", help="print the manifest as JSON")
    register.set_defaults(func=cmd_register)


def cmd_register(args: argparse.Namespace) -> int:
    from marin.catalog import resolve_show_target
    from marin.execution.store.location import open_prefix
    from marin.execution.store.registry import (
        ArtifactAlreadyExistsError,
        InvalidArtifactIdError,
        RegistryId,
        manifest_fields,
        register,
        registered_by,
    )

    reg_id = RegistryId.parse(args.artifact_id)  # a bad id fails before any read
    prefix = open_prefix(args.prefix)
    location, output_path = resolve_show_target(args.step, args.prefix)
    if location.url != prefix.url:
        raise InvalidArtifactIdError(
            f"{args.step} is not under the prefix {prefix.url}",
            "register a build of the prefix the registry lives in (give it with --prefix)",
        )
    try:
        manifest = register(location, output_path, reg_id, registered_by())
    except ArtifactAlreadyExistsError as exc:
        print(safe_text(str(exc)), file=sys.stderr)
        return 1
    if args.json:
        fields = {**manifest_fields(manifest), "url": manifest.url(location)}
        print(safe_json(json.dumps(fields, indent=2, ensure_ascii=False)))
    else:
        print(
            safe_text(
                f"registered {manifest.id}: {manifest.step} (build {manifest.build_id}), "
                f"data at {manifest.url(location)}"
            )
        )
    return 0
