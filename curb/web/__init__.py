"""The web front: everything Curb serves over HTTP and WebSocket on -http, on the broker's own event loop.

It is built on aiohttp, one library for the HTTP/1.1 server, WebSocket, TLS and routing.
Measured against websockets with h11 in one run of two small prototypes on the same
machine (wrk -c64 POSTs of 100 bytes with keep-alive, and a WebSocket echo of 100-byte
messages): the server's CPU time per HTTP request was about the same (aiohttp 132 us,
h11 116 us; aiohttp's parser is llhttp, in C, where h11 is pure Python and would need an
HTTP server of our own around it), and per WebSocket message aiohttp took 16 us to
websockets' 28 us. aiohttp also needs no second library for the HTTP API beside the
WebSocket endpoints, which websockets (a WebSocket library first) would.

Modules: `front` starts and stops the listener and routes; `replies` answers errors as
JSON; `access` checks HTTP Basic logins, permissions and Origin; `stats` serves
/metrics (rendered by `exposition`) and /stats. The broker imports this package only
when -http asks for it, so aiohttp and prometheus_client cost nothing without it.
"""
