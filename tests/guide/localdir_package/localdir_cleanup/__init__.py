"""A digest-cleanup target kind for the files of a local directory."""
