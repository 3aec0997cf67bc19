"""lagdoctor: incident automation for Kafka consumer lag."""

__version__ = "0.1.0"
