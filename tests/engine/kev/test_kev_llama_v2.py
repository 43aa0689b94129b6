"""Kev's llama-server prompt, JSON schema and GBNF grammar for a portfolio context (v2), and the v1
ones unchanged."""

import dataclasses

import jsonschema
import orjson
import pytest

from engine.kev.advisor import InstrumentState, KevContext, KevContextV2, PairState
from engine.kev.choices import choices
from engine.kev.command import CommandV2, check_sense, command_schema_v2, validate_command_v2
from engine.kev.llama import LlamaAdvisor, LlamaConfig
from engine.kev.pairs import RulePairsKev
from engine.kev.prompt import (
    COMMAND_GRAMMAR,
    COMMAND_SCHEMA_SHA256,
    PROMPT_TEMPLATE_SHA256,
    command_grammar_v2_for,
    command_schema_v2_for,
    render_messages,
    render_messages_v2,
)
from tests.gbnf import matches

V1_CTX = KevContext(
    request_id=1,
    ts_ns=0,
    symbol="BTCUSDT",
    label="LEAN_BUY",
    label_seq=1,
    p_label=0.9,
    mid=90000.0,
    spread=0.1,
    imbalance=0.3,
    position=0.0,
    max_position=0.05,
)


def ctx(z=2.5):
    return KevContextV2(
        request_id=3,
        ts_ns=9,
        symbol="ETHUSDT",
        label="LEAN_SELL",
        label_seq=2,
        p_label=0.75,
        instruments=(
            InstrumentState(
                symbol="BTCUSDT",
                position=0.02,
                mark=90000.0,
                spread=0.1,
                labels=("HOLD", "LEAN_BUY"),
                max_position=0.1,
            ),
            InstrumentState(
                symbol="ETHUSDT", position=-1.0, mark=3000.0, spread=0.01, labels=(), max_position=2.0
            ),
        ),
        pairs=(PairState(leader="BTCUSDT", follower="ETHUSDT", spread=0.0012, z=z, hedge_ratio=1.2),),
    )


GOOD = {
    "schema_version": 2,
    "action": "LEAN_SELL",
    "targets": {"BTCUSDT": 0.04, "ETHUSDT": -1.0},
    "pairs": [{"leader": "BTCUSDT", "follower": "ETHUSDT", "hedge_ratio": 1.2}],
    "max_slippage_bps": 5,
    "reason": "ETH rich against BTC",
}


def test_v1_prompt_schema_and_grammar_are_unchanged():
    # hashes of the v1 template and schema as released: a cassette's keys depend on them
    assert PROMPT_TEMPLATE_SHA256 == "436d4eba7b1273a4de05765bb7772326df4c81b6bd2a8e6ca8ee3ea00d38f544"
    assert COMMAND_SCHEMA_SHA256 == "6ae01c4656eb1fbec38015e413a5be9355712f02975872e7f7aecd0111821630"
    kev = LlamaAdvisor(LlamaConfig(base_url="http://127.0.0.1:9"))
    body = kev.request_body(V1_CTX)
    assert body["messages"] == render_messages(V1_CTX)
    assert body["messages"][1]["content"].startswith("symbol: BTCUSDT\nsignal: LEAN_BUY (probability 0.9)")
    assert kev.request_body(V1_CTX, "grammar")["grammar"] == COMMAND_GRAMMAR


def test_the_v2_request_carries_the_portfolio_its_choices_and_its_schema():
    kev = LlamaAdvisor(LlamaConfig(base_url="http://127.0.0.1:9"))
    body = kev.request_body(ctx())
    user = body["messages"][1]["content"]
    assert body["messages"] == render_messages_v2(ctx())
    assert (
        "- BTCUSDT: position 0.02 (limit 0.1), mark 90000, spread 0.1, recent labels HOLD, LEAN_BUY" in user
    )
    assert "- ETHUSDT on BTCUSDT: spread 0.0012, z-score 2.5, fitted hedge_ratio 1.2" in user
    # the choices, each the pairs rule's sizing: 0.08 BTC x 90000 = 1.2 x 2 ETH x 3000
    assert '- hold: {"BTCUSDT":0.02,"ETHUSDT":-1.0}' in user
    assert '- flat: {"BTCUSDT":0.0,"ETHUSDT":0.0}' in user
    assert '- sell ETHUSDT, buy BTCUSDT: {"BTCUSDT":0.08,"ETHUSDT":-2.0}' in user
    assert '- buy ETHUSDT, sell BTCUSDT: {"BTCUSDT":-0.08,"ETHUSDT":2.0}' in user
    assert "z-score n/a" in render_messages_v2(ctx(z=float("nan")))[1]["content"]
    schema = body["response_format"]["json_schema"]["schema"]
    assert schema == command_schema_v2_for(ctx())
    assert kev.request_body(ctx(), "grammar")["grammar"] == command_grammar_v2_for(ctx())
    # v2 keys are stable, differ from any v1 key and follow the market, not ids
    assert kev.key(ctx()) == kev.key(ctx()) and kev.key(ctx()) != kev.key(ctx(z=2.4))
    assert kev.key(ctx()) != kev.key(V1_CTX)


def test_no_entry_is_offered_before_the_pair_has_a_z_score():
    names = [c.name for c in choices(ctx(z=float("nan")))]
    assert names == ["flat", "hold"]
    c = ctx(z=float("nan"))
    flat = KevContextV2(
        **{
            **{f: getattr(c, f) for f in c.__slots__},
            "instruments": tuple(dataclasses.replace(i, position=0.0) for i in c.instruments),
        }
    )
    assert [c.name for c in choices(flat)] == ["flat"]  # holding nothing is the flat choice
    assert "c-0" in command_grammar_v2_for(flat) and command_schema_v2_for(flat)["anyOf"][0]["properties"][
        "targets"
    ] == {"enum": [{"BTCUSDT": 0.0, "ETHUSDT": 0.0}]}


def _text(obj, indent=False):
    return orjson.dumps(obj, option=orjson.OPT_INDENT_2 if indent else 0).decode()


ENTRY = {**GOOD, "targets": {"BTCUSDT": 0.08, "ETHUSDT": -2.0}}


@pytest.mark.parametrize(
    "obj",
    [
        ENTRY,
        {**ENTRY, "action": "HOLD", "targets": {"BTCUSDT": 0.02, "ETHUSDT": -1.0}},
        {**ENTRY, "action": "LEAN_BUY", "targets": {"BTCUSDT": -0.08, "ETHUSDT": 2.0}},
        {**ENTRY, "action": "EMERGENCY_FLATTEN", "targets": {"BTCUSDT": 0.0, "ETHUSDT": 0.0}},
        {**ENTRY, "reason": 'quote " and \\ fine'},
    ],
)
def test_every_command_the_constraint_admits_validates_and_makes_sense(obj):
    grammar = command_grammar_v2_for(ctx())
    text = _text(obj)
    assert matches(grammar, text), text
    parsed = orjson.loads(text)
    jsonschema.validate(parsed, command_schema_v2_for(ctx()))
    jsonschema.validate(parsed, command_schema_v2(ctx().symbols, ctx().pair_keys))  # narrower, never wider
    cmd = validate_command_v2(parsed, ctx().symbols, ctx().pair_keys)
    assert isinstance(cmd, CommandV2)
    c = ctx()
    sense = check_sense(
        cmd,
        {i.symbol: i.position for i in c.instruments},
        {i.symbol: i.mark for i in c.instruments},
        {i.symbol: i.max_position for i in c.instruments},
    )
    assert sense == ""


@pytest.mark.parametrize(
    "obj",
    [
        {k: v for k, v in ENTRY.items() if k != "schema_version"},
        {**ENTRY, "schema_version": 1},
        GOOD,  # free targets: BTC 0.04 against 1.2 x 1 ETH is no hedge
        {**ENTRY, "targets": {"BTCUSDT": 0.08, "ETHUSDT": 2.0}},  # both legs long
        {**ENTRY, "targets": {"ETHUSDT": -2.0, "BTCUSDT": 0.08}},  # the instruments' order
        {**ENTRY, "targets": {"BTCUSDT": 0.08}},
        {**ENTRY, "action": "EMERGENCY_FLATTEN"},  # a flatten keeping positions
        {**ENTRY, "pairs": []},
        {**ENTRY, "pairs": [{**ENTRY["pairs"][0], "hedge_ratio": 1.3}]},  # not the fitted ratio
        {**ENTRY, "pairs": [{**ENTRY["pairs"][0], "follower": "SOLUSDT"}]},
        {**ENTRY, "action": "BUY"},
        {**ENTRY, "reason": "x" * 41},
    ],
)
def test_the_constraint_refuses_what_is_not_an_offered_command(obj):
    text = _text(obj)
    assert not matches(command_grammar_v2_for(ctx()), text)
    if list(obj.get("targets", {})) == ["ETHUSDT", "BTCUSDT"]:
        return  # a JSON object's order is the grammar's business only: the schema compares values
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(orjson.loads(text), command_schema_v2_for(ctx()))


def test_the_v1_grammar_parses_v1_examples():
    v1 = {
        "action": "LEAN_BUY",
        "target_position": 0.5,
        "hedge_ratio": 0.2,
        "max_slippage_bps": 5,
        "reason": "x",
    }
    assert matches(COMMAND_GRAMMAR, _text(v1))
    assert not matches(COMMAND_GRAMMAR, _text({**v1, "hedge_ratio": 1.5}))
    assert not matches(COMMAND_GRAMMAR, _text(GOOD))


def test_the_pairs_rules_entry_is_one_of_the_choices():
    raw = RulePairsKev().decide(ctx())
    jsonschema.validate(raw, command_schema_v2(ctx().symbols, ctx().pair_keys))
    assert raw["targets"] in [dict(c.targets) for c in choices(ctx())]


def test_a_context_without_pairs_offers_hold_and_flat():
    c = ctx()
    one = KevContextV2(
        **{**{f: getattr(c, f) for f in c.__slots__}, "instruments": c.instruments[:1], "pairs": ()}
    )
    grammar = command_grammar_v2_for(one)
    obj = {**GOOD, "targets": {"BTCUSDT": 0.0}, "pairs": []}
    assert matches(grammar, _text(obj))
    assert not matches(grammar, _text({**obj, "targets": {"BTCUSDT": 0.01}}))
    jsonschema.validate(obj, command_schema_v2_for(one))
    assert isinstance(validate_command_v2(obj, one.symbols, one.pair_keys), CommandV2)
