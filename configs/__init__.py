"""Typed OmegaConf configs: the schema, the shipped YAML files, loading and rendering."""
