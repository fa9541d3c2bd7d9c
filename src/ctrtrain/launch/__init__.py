"""Jobs: the YAML job spec, the local multi-host launcher and its process supervisor."""
