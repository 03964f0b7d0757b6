"""The HTTP face of rate limiting: rules, identity, routes, headers, guard, middleware and decorator
(apart from the engine, which knows nothing of HTTP)."""
