"""The HTTP edge every surface shares: the middleware, session lookup and auth, bodies and their
limits, SSE, disconnects, and the server's HTTP protocol. It knows no surface's shapes."""
