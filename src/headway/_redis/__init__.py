"""Our Redis plumbing: script loading (NOSCRIPT), the pipelined connection, error mapping."""
