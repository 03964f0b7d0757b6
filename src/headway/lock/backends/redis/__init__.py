"""The Redis lock backend (single node or Cluster), async and sync."""
