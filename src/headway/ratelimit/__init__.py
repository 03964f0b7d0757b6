"""Rate limiting: policies, limiters, concurrency limits, their backends, middleware, decorator.

Why each module is built as it is: ``docs/decisions/index.md`` lists the decisions by file.
"""
