"""Everything that talks to Kafka: clients from configuration, the snapshot
collector and the reads it is made of (group listing, group reads, log offsets,
records), `describe`, and the embedded Apache Kafka broker."""
