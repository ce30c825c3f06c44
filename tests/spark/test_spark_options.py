"""Option parsing of the `curb` format: defaults, case-insensitivity, and errors that name the option."""

import pytest

from curb.spark.options import Endpoint, OptionError, parse_endpoints, parse_paths, parse_sink, parse_source


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


def test_source_defaults_keep_the_prefetch_window_twice_the_batch():
    options = parse_source({"endpoints": "h:1", "batchSize": "50"})
    assert (options.batch_size, options.prefetch) == (50, 100)
    assert options.connection.heartbeat_ms == 0
    assert options.connection.login is None


def test_option_names_are_case_insensitive():
    options = parse_source({"ENDPOINTS": "h:1", "batchsize": "7", "PreFetch": "30", "Login": "u", "passCode": "p"})
    assert (options.batch_size, options.prefetch) == (7, 30)
    assert (options.connection.login, options.connection.passcode) == ("u", "p")


@pytest.mark.parametrize(
    "name, value, fragment",
    [
        ("batchSize", "many", "option 'batchSize' must be an integer, got 'many'"),
        ("batchSize", "0", "option 'batchSize' must be a positive integer"),
        ("prefetch", "-3", "option 'prefetch' must be a positive integer"),
        ("prefetch", "1999", "option 'prefetch' (1999) must be at least twice 'batchSize' (1000)"),
        ("pollMs", "0", "option 'pollMs' must be a positive integer"),
        ("heartbeat", "-1", "option 'heartbeat' must be 0 (off) or a number of milliseconds"),
        ("timeout", "0", "option 'timeout' must be a positive number of seconds"),
    ],
)
def test_bad_source_numbers_name_the_option(name, value, fragment):
    with pytest.raises(OptionError) as raised:
        parse_source({"endpoints": "h:1", name: value})
    assert fragment in str(raised.value)


def test_sink_options():
    options = parse_sink({"endpoints": "h:1,h:2", "window": "10", "key": "user"})
    assert (len(options.endpoints), options.window, options.key) == (2, 10, "user")
    assert parse_sink({"endpoints": "h:1"}).key is None
    with pytest.raises(OptionError, match="option 'window' must be a positive integer"):
        parse_sink({"endpoints": "h:1", "window": "0"})


def test_paths_come_from_load():
    assert parse_paths({"path": "a.log"}) == ["a.log"]
    assert parse_paths({"paths": '["a.log", "b.log"]'}) == ["a.log", "b.log"]
    with pytest.raises(OptionError, match="needs log files"):
        parse_paths({"endpoints": "h:1"})
