"""``dualhub``: one console command, one subcommand per job.

Each package contributes its subcommands through a ``register(subparsers)`` function, so this module
only wires them together.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import re
import signal
import sys
import textwrap
import threading
from collections.abc import Sequence
from typing import NoReturn

from engine.errors import DualhubError, os_error_text
from engine.optional import install_hint, is_optional, loud_cuda_fallback, quiet_cuda_fallback

# Modules providing ``register(subparsers)``; a module that does not exist yet is skipped.
COMMAND_MODULES = (
    "replay.cli",
    "recorder.cli",
    "replay.kev_cli",
    "replay.train_cli",
    "replay.tools_cli",
    "replay.catalog",
    "dualhub.doctor",
    "live.cli",
)


class _CommaWrapper(textwrap.TextWrapper):
    """Wraps help text between words and after the commas of a list written without spaces (rule
    names, symbols), never inside a name: textwrap alone breaks such a list mid-word."""

    wordsep_simple_re = re.compile(r"(\s+|(?<=,)(?=[^\s,]))")

    def __init__(self, width: int) -> None:
        super().__init__(width, break_long_words=False, break_on_hyphens=False)


class HelpFormatter(argparse.HelpFormatter):
    def _split_lines(self, text: str, width: int) -> list[str]:
        return _CommaWrapper(width).wrap(self._whitespace_matcher.sub(" ", text).strip())

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        w = _CommaWrapper(width)
        w.initial_indent = w.subsequent_indent = indent
        return w.fill(self._whitespace_matcher.sub(" ", text).strip())


class Parser(argparse.ArgumentParser):
    """A usage error is one line, like every other error (the usage itself is one --help away)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _parsers(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    """``parser`` and every subcommand's parser below it."""
    out = [parser]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in dict.fromkeys(action.choices.values()):  # an alias maps to the same parser
                out.extend(_parsers(sub))
    return out


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(  # subcommands' parsers are made of the same class
        prog="dualhub",
        formatter_class=HelpFormatter,
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
    for p in _parsers(parser):  # subparsers do not inherit the formatter
        p.formatter_class = HelpFormatter
    return parser


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where Python runs next: it unwinds like Ctrl-C, so every ``.tmp`` a command was
    writing is removed on the way out (``engine.store._staged``, the replay's run directory)."""


def _on_sigterm(signum: int, frame: object) -> None:
    raise Terminated


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
    if not args.verbose:  # -v keeps Laya's full CUDA-fallback warning
        quiet_cuda_fallback()
    # commands with an event loop (live, record) install their own SIGTERM handling over this one;
    # signal handlers can only be set from the main thread (a test may call main() from another)
    main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _on_sigterm) if main_thread else None
    try:
        return int(args.func(args) or 0)
    except DualhubError as e:
        print(f"dualhub {args.command}: error: {e}", file=sys.stderr)
        return 2
    except Terminated:
        print(f"dualhub {args.command}: terminated (SIGTERM)", file=sys.stderr)
        return 128 + signal.SIGTERM
    except KeyboardInterrupt:
        print(f"dualhub {args.command}: interrupted", file=sys.stderr)
        return 130
    except ModuleNotFoundError as e:
        if not is_optional(e.name):
            raise  # a module dualhub always installs: a broken install or a bug, worth its traceback
        print(f"dualhub {args.command}: error: {install_hint(e.name or '')}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        # the reader went away (`dualhub report RUN | head`): not an error, and nothing more to say;
        # stdout goes to /dev/null so the interpreter's final flush does not fail a second time
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + signal.SIGPIPE
    except OSError as e:  # a full disk, a permission, a path: the user's to fix, not a bug to trace
        print(f"dualhub {args.command}: error: {os_error_text(e)}", file=sys.stderr)
        return 2
    except SystemExit as e:
        if isinstance(e.__context__, BrokenPipeError):  # rich's own answer to a closed pipe
            return 128 + signal.SIGPIPE
        # no dualhub command exits this way: user code it runs (a strategy, a plugin) called sys.exit(),
        # which must not pass for a finished command with status 0
        print(
            f"dualhub {args.command}: error: stopped by SystemExit({e.code!r}) from code it ran "
            "(a strategy or plugin calling sys.exit?)",
            file=sys.stderr,
        )
        return 2
    finally:
        if main_thread:
            signal.signal(signal.SIGTERM, previous)
        # the filter is this command's: a process that goes on (a test, a notebook) hears Laya again
        loud_cuda_fallback()


if __name__ == "__main__":
    raise SystemExit(main())
