"""The etcd lock backend (extra ``headway[etcd]``): ``backend`` runs etcd's mutex recipe
(``modes`` its weighted form) on session leases (``session``), over gRPC
(``grpc_transport``, ``proto``) or the v3 JSON gateway (``gateway``)."""
