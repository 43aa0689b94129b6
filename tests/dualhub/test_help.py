"""``--help`` explains everything: the whole argparse tree is walked, and every command must have a
summary and a description and every option and positional argument a help text (issue 58)."""

from __future__ import annotations

import argparse
import re

import pytest

from dualhub.cli import _parsers, build_parser, main


def _missing(parser: argparse.ArgumentParser, path: str) -> list[str]:
    out = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            summaries = {c.dest: c.help for c in action._choices_actions}
            for name, sub in action.choices.items():
                if not summaries.get(name):
                    out.append(f"{path} {name}: no summary (help=)")
                if not sub.description:
                    out.append(f"{path} {name}: no description")
                out += _missing(sub, f"{path} {name}")
        elif not isinstance(action, argparse._HelpAction) and not action.help:
            out.append(f"{path} {'/'.join(action.option_strings) or action.dest}: no help")
    return out


def test_every_command_and_option_has_help():
    assert _missing(build_parser(), "dualhub") == []


def test_the_walk_finds_a_missing_help():
    # the walk itself: a parser with a bare option and a command without a description is reported
    p = argparse.ArgumentParser()
    p.add_argument("--bare")
    p.add_subparsers().add_parser("x", help="an x")
    assert _missing(p, "t") == ["t --bare: no help", "t x: no description"]


def _help_texts() -> list[tuple[str, str]]:
    return [(p.prog, p.format_help()) for p in _parsers(build_parser())]


def test_every_help_renders_and_names_nothing_undefined():
    texts = _help_texts()
    assert len(texts) > 20
    for prog, text in texts:
        assert "OUT_DIR" not in text, prog  # sweep once named a directory no option defines
        assert "%(" not in text, prog


def test_a_comma_list_is_never_wrapped_mid_name(monkeypatch):
    from engine.risk import DEFAULT_RULES

    monkeypatch.setenv("COLUMNS", "100")
    text = next(t for prog, t in _help_texts() if prog == "dualhub replay")
    block = re.search(r"\n  --risk-rules NAMES +(.*?)\n  --", text, re.S).group(1)
    words = set(re.findall(r"[a-z_]+", block))
    assert set(DEFAULT_RULES) <= words  # each name whole on some line


@pytest.mark.parametrize("command", ["report", "demo", "recover", "serve", "kill", "sweep", "train"])
def test_command_help_exits_0(command, capsys):
    with pytest.raises(SystemExit) as e:
        main([command, "--help"])
    assert e.value.code == 0
    assert capsys.readouterr().out.startswith("usage: dualhub " + command)
