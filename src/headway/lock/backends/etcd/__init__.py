"""The etcd lock backend (extra ``headway[etcd]``): ``gateway`` talks to etcd's v3
JSON gateway over httpx, ``backend`` runs etcd's mutex recipe on it."""
