"""Everything that talks to another system: ZooKeeper, Kafka, bookies, Delta tables, embedded servers."""
