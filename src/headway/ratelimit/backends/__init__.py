"""Rate-limit backends, each implementing ``contract``."""
