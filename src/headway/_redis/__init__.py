"""Our Redis plumbing, one module per job.

``scripts`` loads the Lua scripts; ``resp`` packs and frames requests; ``connection``
is the pipelined protocol on a socket taken over from redis-py; ``wire`` runs script
calls on it per event loop (``sync_wire`` from sync code); ``errors`` says what a
failure means.
"""
