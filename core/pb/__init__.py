"""Generated protobuf code (do not edit). Regenerate with ``make proto`` from the sources in ``proto/``."""
