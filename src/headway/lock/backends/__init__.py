"""Lock backends, each implementing the contract in ``headway.lock.contract``."""
