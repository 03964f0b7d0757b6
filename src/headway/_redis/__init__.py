"""Our Redis plumbing, one module per job.

``scripts`` loads the Lua scripts; ``resp`` packs and frames requests; ``connection``
is the pipelined protocol on a socket taken over from redis-py; ``wire`` runs script
calls on it per event loop (``sync_wire`` from sync code); ``cluster_wire`` and
``sync_cluster_wire`` do the same on a Redis Cluster, a connection per primary, calls
routed by slot; ``errors`` says what a failure means.

Why each module is built as it is: ``docs/decisions/index.md`` lists the decisions by file.
"""
