"""Rate limiting: policies, limiters, concurrency limits, their backends, middleware, decorator."""
