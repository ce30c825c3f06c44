"""Option parsing of the `curb` format: defaults, case-insensitivity, unknown names, and
one-line errors that name the option."""

import pytest

from curb.spark.options import (
    DEFAULT_RECONNECT_TIMEOUT_S,
    DEFAULT_ROWS_PER_PARTITION,
    MAX_ROWS_NONE,
    Endpoint,
    OptionError,
    Routed,
    parse_endpoints,
    parse_paths,
    parse_sink,
    parse_source,
)


@pytest.mark.parametrize(
    "text, expected",
    [
        ("127.0.0.1:61613", [Endpoint("127.0.0.1", 61613, "127.0.0.1:61613")]),
        ("h1:1, h2:2", [Endpoint("h1", 1, "h1:1"), Endpoint("h2", 2, "h2:2")]),
        ("[::1]:61613", [Endpoint("::1", 61613, "[::1]:61613")]),
    ],
)
def test_endpoints_are_host_port_lists(text, expected):
    assert list(parse_endpoints({"endpoints": text})) == expected


@pytest.mark.parametrize(
    "options, fragment",
    [
        ({}, "option 'endpoints' is required"),
        ({"endpoints": " "}, "option 'endpoints' is required"),
        ({"endpoints": "localhost"}, "'localhost' is not HOST:PORT"),
        ({"endpoints": "h:0"}, "'h:0' is not HOST:PORT"),
        ({"endpoints": "h:65536"}, "'h:65536' is not HOST:PORT"),
        ({"endpoints": "h:port"}, "'h:port' is not HOST:PORT"),
        ({"endpoints": ":61613"}, "':61613' is not HOST:PORT"),
        ({"endpoints": "h:1,"}, "'' is not HOST:PORT"),
        ({"endpoints": "::1:61613"}, "put an IPv6 host in brackets"),
        ({"endpoints": "h:1,h:1"}, "h:1 listed more than once"),
    ],
)
def test_bad_endpoints_name_the_option(options, fragment):
    with pytest.raises(OptionError, match="'endpoints'") as raised:
        parse_source(options)
    assert fragment in str(raised.value)


@pytest.mark.parametrize("parse", [parse_source, parse_sink])
@pytest.mark.parametrize("destination", ["orders", "/queue/orders", "./orders"])
def test_a_router_and_a_destination_take_the_place_of_endpoints(parse, destination):
    options = parse({"Router": "r:61614", "destination": destination})
    assert (options.endpoints, options.routed) == ((), Routed(Endpoint("r", 61614, "r:61614"), "orders"))
    assert parse({"endpoints": "h:1"}).routed is None


@pytest.mark.parametrize(
    "options, fragment",
    [
        ({"endpoints": "h:1", "router": "r:1", "destination": "q"}, "'endpoints' and 'router' exclude each other"),
        ({"destination": "q"}, "option 'destination' needs 'router'"),
        ({"router": "r:1"}, "option 'destination' must name one of the router's destinations"),
        ({"router": "r:1", "destination": "a b"}, "got 'a b'"),
        ({"router": "r:1", "destination": "/topic/a"}, "got '/topic/a'"),
        ({"router": "r", "destination": "q"}, "option 'router': 'r' is not HOST:PORT"),
    ],
)
def test_bad_router_options_name_the_option(options, fragment):
    with pytest.raises(OptionError) as raised:
        parse_source(options)
    assert fragment in str(raised.value)


def test_source_defaults():
    options = parse_source({"endpoints": "h:1"})
    assert options.reconnect_timeout_s == DEFAULT_RECONNECT_TIMEOUT_S
    assert options.max_rows_per_batch == MAX_ROWS_NONE
    assert options.rows_per_partition == DEFAULT_ROWS_PER_PARTITION
    assert (options.connection.heartbeat_ms, options.connection.login) == (0, None)


def test_option_names_are_case_insensitive():
    options = parse_source(
        {"ENDPOINTS": "h:1", "maxrowsperbatch": "7", "RowsPerPartition": "30", "Login": "u", "passCode": "p"}
    )
    assert (options.max_rows_per_batch, options.rows_per_partition) == (7, 30)
    assert (options.connection.login, options.connection.passcode) == ("u", "p")


@pytest.mark.parametrize(
    "name, value, fragment",
    [
        ("maxRowsPerBatch", "many", "option 'maxRowsPerBatch' must be an integer, got 'many'"),
        ("maxRowsPerBatch", "-1", "option 'maxRowsPerBatch' must be 0 (no limit) or a positive number of rows"),
        ("rowsPerPartition", "0", "option 'rowsPerPartition' must be a positive number of message ids"),
        ("reconnectTimeout", "0", "option 'reconnectTimeout' must be a positive number of seconds"),
        ("heartbeat", "-1", "option 'heartbeat' must be 0 (off) or a number of milliseconds"),
        ("timeout", "0", "option 'timeout' must be a positive number of seconds"),
        ("timeout", "1.5", "option 'timeout' must be an integer, got '1.5'"),
    ],
)
def test_bad_source_numbers_name_the_option(name, value, fragment):
    with pytest.raises(OptionError) as raised:
        parse_source({"endpoints": "h:1", name: value})
    assert fragment in str(raised.value)


@pytest.mark.parametrize(
    "parse, name, allowed",
    [
        (
            parse_source,
            "batch_size",
            "endpoints, router, destination, login, passcode, heartbeat, timeout, reconnectTimeout, maxRowsPerBatch",
        ),
        (parse_source, "window", "maxRowsPerBatch"),
        (
            parse_sink,
            "maxRowsPerBatch",
            "endpoints, router, destination, login, passcode, heartbeat, timeout, window, key",
        ),
        (parse_paths, "batchSize", "none but the path"),
    ],
)
def test_an_unknown_option_is_refused_naming_the_allowed_ones(parse, name, allowed):
    with pytest.raises(OptionError) as raised:
        parse(
            {"endpoints": "h:1", "path": "a.log", name: "1"} if parse is not parse_paths else {"path": "a", name: "1"}
        )
    message = str(raised.value)
    assert message.startswith(f"curb option {name!r} is unknown")
    assert allowed in message and "\n" not in message


@pytest.mark.parametrize(
    "name, expected",
    [
        ("batchsize", "curb option 'batchSize' was removed: use 'maxRowsPerBatch' instead"),
        ("PREFETCH", "curb option 'prefetch' was removed: remove it: the source reads by browse"),
        ("pollms", "curb option 'pollMs' was removed: remove it: the query's trigger sets how often"),
    ],
)
def test_a_removed_option_is_spelled_as_documented_and_names_what_took_its_place(name, expected):
    """Spark lower-cases option names before the source sees them."""
    with pytest.raises(OptionError) as raised:
        parse_source({"endpoints": "h:1", name: "1000"})
    assert str(raised.value).startswith(expected)


def test_an_option_of_the_other_mode_is_spelled_as_documented():
    with pytest.raises(OptionError, match=r"^curb option 'maxRowsPerBatch' is unknown for a write"):
        parse_sink({"endpoints": "h:1", "maxrowsperbatch": "10"})
    with pytest.raises(OptionError, match=r"^curb option 'batchSize' is unknown for a write"):
        parse_sink({"endpoints": "h:1", "batchsize": "10"})


def test_sink_options():
    options = parse_sink({"endpoints": "h:1,h:2", "window": "10", "key": "user"})
    assert (len(options.endpoints), options.window, options.key) == (2, 10, "user")
    assert parse_sink({"endpoints": "h:1"}).key is None
    with pytest.raises(OptionError, match="option 'window' must be a positive number of receipts"):
        parse_sink({"endpoints": "h:1", "window": "0"})


def test_paths_come_from_load():
    assert parse_paths({"path": "a.log"}) == ["a.log"]
    assert parse_paths({"paths": '["a.log", "b.log"]'}) == ["a.log", "b.log"]
    with pytest.raises(OptionError, match="needs log files"):
        parse_paths({})
