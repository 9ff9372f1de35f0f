"""The runtime core: state-schema migration, intent identity and signing."""
