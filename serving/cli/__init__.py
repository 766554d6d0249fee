"""The `serving` command line."""
