"""Kev's llama-server prompt, JSON schema and GBNF grammar for a portfolio context (v2), and the v1
ones unchanged."""

import jsonschema
import orjson
import pytest

from engine.kev.advisor import InstrumentState, KevContext, KevContextV2, PairState
from engine.kev.command import CommandV2, validate_command_v2
from engine.kev.llama import (
    COMMAND_GRAMMAR,
    COMMAND_SCHEMA_SHA256,
    PROMPT_TEMPLATE_SHA256,
    LlamaAdvisor,
    LlamaConfig,
    command_grammar_v2,
    command_schema_v2_for,
    render_messages,
    render_messages_v2,
)
from engine.kev.pairs import RulePairsKev
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


def test_the_v2_request_carries_the_portfolio_and_its_schema():
    kev = LlamaAdvisor(LlamaConfig(base_url="http://127.0.0.1:9"))
    body = kev.request_body(ctx())
    user = body["messages"][1]["content"]
    assert body["messages"] == render_messages_v2(ctx())
    assert (
        "- BTCUSDT: position 0.02 (limit 0.1), mark 90000, spread 0.1, recent labels HOLD, LEAN_BUY" in user
    )
    assert "- ETHUSDT on BTCUSDT: spread 0.0012, z-score 2.5, fitted hedge_ratio 1.2" in user
    assert "z-score n/a" in render_messages_v2(ctx(z=float("nan")))[1]["content"]
    schema = body["response_format"]["json_schema"]["schema"]
    assert schema == command_schema_v2_for(ctx()) and schema["required"][0] == "schema_version"
    assert kev.request_body(ctx(), "grammar")["grammar"] == command_grammar_v2(ctx().symbols, ctx().pair_keys)
    # v2 keys are stable, differ from any v1 key and follow the market, not ids
    assert kev.key(ctx()) == kev.key(ctx()) and kev.key(ctx()) != kev.key(ctx(z=2.4))
    assert kev.key(ctx()) != kev.key(V1_CTX)


def _text(obj, indent=False):
    return orjson.dumps(obj, option=orjson.OPT_INDENT_2 if indent else 0).decode()


@pytest.mark.parametrize(
    "obj",
    [
        GOOD,
        {**GOOD, "action": "EMERGENCY_FLATTEN", "targets": {"BTCUSDT": 0, "ETHUSDT": 0}},
        {
            **GOOD,
            "targets": {"BTCUSDT": -10, "ETHUSDT": 9.999},
            "pairs": [{**GOOD["pairs"][0], "hedge_ratio": 10}],
        },
        {**GOOD, "reason": 'quote " and \\ fine'},
    ],
)
def test_commands_the_grammar_admits_validate(obj):
    grammar = command_grammar_v2(ctx().symbols, ctx().pair_keys)
    text = _text(obj)
    assert matches(grammar, text), text
    parsed = orjson.loads(text)
    jsonschema.validate(parsed, command_schema_v2_for(ctx()))
    assert isinstance(validate_command_v2(parsed, ctx().symbols, ctx().pair_keys), CommandV2)


@pytest.mark.parametrize(
    "obj",
    [
        {k: v for k, v in GOOD.items() if k != "schema_version"},
        {**GOOD, "schema_version": 1},
        {**GOOD, "targets": {"ETHUSDT": -1.0, "BTCUSDT": 0.04}},  # the instruments' order
        {**GOOD, "targets": {"BTCUSDT": 0.04}},
        {**GOOD, "targets": {"BTCUSDT": 11, "ETHUSDT": 0}},
        {**GOOD, "pairs": []},
        {**GOOD, "pairs": [{**GOOD["pairs"][0], "hedge_ratio": 10.5}]},
        {**GOOD, "pairs": [{**GOOD["pairs"][0], "follower": "SOLUSDT"}]},
        {**GOOD, "action": "BUY"},
    ],
)
def test_the_grammar_refuses_what_is_not_a_command(obj):
    assert not matches(command_grammar_v2(ctx().symbols, ctx().pair_keys), _text(obj))


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


def test_the_pairs_advisor_answers_within_the_schema():
    raw = RulePairsKev().decide(ctx())
    jsonschema.validate(raw, command_schema_v2_for(ctx()))
    # three decimals are all the grammar gives a model; the rule's targets fit it here
    assert matches(command_grammar_v2(ctx().symbols, ctx().pair_keys), _text(raw)), _text(raw)


def test_a_context_without_pairs_gets_an_empty_pairs_array():
    c = ctx()
    one = KevContextV2(
        **{**{f: getattr(c, f) for f in c.__slots__}, "instruments": c.instruments[:1], "pairs": ()}
    )
    grammar = command_grammar_v2(one.symbols, one.pair_keys)
    obj = {**GOOD, "targets": {"BTCUSDT": 0.01}, "pairs": []}
    assert matches(grammar, _text(obj))
    jsonschema.validate(obj, command_schema_v2_for(one))
    assert isinstance(validate_command_v2(obj, one.symbols, one.pair_keys), CommandV2)
