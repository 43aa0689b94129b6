"""``dualhub``: one console command, one subcommand per job.

Each package contributes its subcommands through a ``register(subparsers)`` function, so this module
only wires them together.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Sequence

from engine.errors import DualhubError, os_error_text

# Modules providing ``register(subparsers)``; a module that does not exist yet is skipped.
COMMAND_MODULES = (
    "replay.cli",
    "recorder.cli",
    "replay.kev_cli",
    "replay.train_cli",
    "replay.tools_cli",
    "dualhub.doctor",
    "live.cli",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dualhub",
        description="Record Bitget USDT-M markets, replay them deterministically through Laya (fast ONNX "
        "classifier), Kev (slow LLM advisor) and the risk gateway, and analyse the event log in DuckDB.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as e:
            if e.name == name:
                continue
            raise
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )
    # -v is dualhub's own detail. numba logs every compiler pass at DEBUG: megabytes on a fresh checkout
    # (no compile cache), which buried the log and blocked a parent that reads our stderr only at the end
    logging.getLogger("numba").setLevel(logging.WARNING)
    try:
        return int(args.func(args) or 0)
    except DualhubError as e:
        print(f"dualhub {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"dualhub {args.command}: interrupted", file=sys.stderr)
        return 130
    except OSError as e:  # a full disk, a permission, a path: the user's to fix, not a bug to trace
        print(f"dualhub {args.command}: error: {os_error_text(e)}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
