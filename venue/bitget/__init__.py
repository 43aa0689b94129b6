"""Local Bitget v2 servers: the public WebSocket (``public_server``), the REST base (``rest_server``)
and the local exchange that puts signed orders, private channels and matching behind them
(``exchange``)."""
