"""Everything that talks to Kafka: clients from configuration, the snapshot
collector, the record reader, `describe`, and the embedded Apache Kafka broker."""
