"""The ZooKeeper lock backend (extra ``headway[zookeeper]``): see ``backend``."""
