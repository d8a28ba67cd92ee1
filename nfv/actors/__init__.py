"""NFVactor: an actor per flow over runtime processes, with replication, recovery and
migration. ``docs/nfv-actors.md`` states the model, its guarantees and its limits."""
